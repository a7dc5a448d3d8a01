"""pipe.core alone: GPipe and 1F1B train what one process trains, and core stays whole.

`core_check.py` imports nothing from pipe outside pipe.core; it runs every configuration
in one 4-rank launch and compares each rank's weights and losses with TrainOneStepCell.
"""
import ast
import os

from launch import ROOT, run_check

CORE = os.path.join(ROOT, "pipe", "core")
LAYOUTS = ["gpipe 2x1", "1f1b 2x1", "gpipe 3x1", "1f1b 3x1", "gpipe 2x2", "1f1b 2x2"]


def test_core_alone_trains_gpipe_and_1f1b_as_one_process():
    job = run_check("core_check.py", 4, timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    lines = [line for line in job.stdout.splitlines() if " rank " in line]
    for layout in LAYOUTS:
        stages, replicas = map(int, layout.split()[1].split("x"))
        mine = [line for line in lines if line.startswith(layout + " rank ")]
        assert len(mine) == stages * replicas, (layout, lines)
        assert all("equal to one process" in line for line in mine), mine


def core_modules():
    return [os.path.join(CORE, name) for name in sorted(os.listdir(CORE)) if name.endswith(".py")]


def test_core_imports_nothing_of_pipe_outside_core():
    for path in core_modules() + [os.path.join(ROOT, "tests", "core_check.py")]:
        with open(path) as f:
            tree = ast.parse(f.read())
        names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module] + \
                [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        outside = [n for n in names if n.split(".")[0] == "pipe" and not n.startswith("pipe.core")]
        assert not outside, (path, outside)


def test_core_reads_in_one_sitting():
    """At most 700 non-blank lines, docstrings included."""
    lines = 0
    for path in core_modules():
        with open(path) as f:
            lines += sum(1 for line in f if line.strip())
    assert lines <= 700, lines
