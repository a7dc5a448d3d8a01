"""docs/reading.md: every link it makes to `pipe/<file>.py#Lfirst-Llast` is exactly one
function's or class's lines, at this commit, and the modes it walks are those the README's
example runs (tests/test_readme.py)."""
import ast
import os
import re

from launch import ROOT


def spans(path):
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    return {(n.lineno, n.end_lineno) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_every_line_reference_is_a_whole_function_or_class():
    with open(os.path.join(ROOT, "docs", "reading.md")) as f:
        cited = re.findall(r"\]\(\.\./(pipe/[\w/]+\.py)#L(\d+)-L(\d+)\)", f.read())
    assert len(cited) >= 15
    for path, first, last in cited:
        assert (int(first), int(last)) in spans(path), f"{path}:{first}-{last}"
