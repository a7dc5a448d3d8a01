"""Activation recomputation: same weights, less activation memory held per stage.

The runs train in the one launch the matrices share (conftest.trained)."""
import numpy as np
import pytest
from launch import assert_same_bits, load, results

FLAGS = ["--data", "synthetic", "--stages", "2", "--layers", "3", "--hidden", "256",
         "--batch-size", "32", "--micro-batches", "4", "--steps", "3", "--no-eval"]
SCHEDULES = ["1f1b", "zb-h1"]


def matrix(root):
    """Every training this module checks (trained in one launch: conftest.trained)."""
    return [(2, FLAGS + ["--schedule", s, "--save", root / f"recompute-{s}-{mode}"] +
             (["--recompute"] if mode == "recompute" else []))
            for s in SCHEDULES for mode in ("keep", "recompute")] + \
        [(2, FLAGS + ["--schedule", "1f1b", "--recompute", "--one-graph", "--save", root / "recompute-1f1b-graph"])]


@pytest.fixture(scope="module")
def runs(trained):
    return {f"{s}-{mode}": (load(trained / f"recompute-{s}-{mode}" / "model.ckpt"),
                            results(trained / f"recompute-{s}-{mode}")[0]["peak_activation_bytes"])
            for s in SCHEDULES for mode in ("keep", "recompute")}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_recompute_gives_the_same_weights_with_less_memory(runs, schedule):
    (keep, kept_bytes), (again, recompute_bytes) = runs[f"{schedule}-keep"], runs[f"{schedule}-recompute"]
    for name, value in keep.items():
        np.testing.assert_allclose(again[name], value, rtol=1e-5, atol=1e-7)
    if schedule == "1f1b":
        # Rank 0 (Dense 784->256, ReLU, Dense 256->256, ReLU) holds 2 micro-batches of 8
        # rows: each Dense's input (the first ReLU's output is the second Dense's input)
        # and the last ReLU's output; with recompute, only the stage input (and the int32
        # scalar a chunk without the loss takes for labels).
        assert kept_bytes == 2 * 8 * (784 + 256 + 256) * 4
        assert recompute_bytes == 2 * (8 * 784 * 4 + 4)
    else:   # a micro-batch waiting for its W holds the recomputed residuals
        assert recompute_bytes < kept_bytes * 0.95


def test_recompute_as_one_graph_is_bitwise_the_loop(trained):
    """The backward's second forward inside the step's graph (the loop's handlers, traced)."""
    graph, loop = load(trained / "recompute-1f1b-graph" / "model.ckpt"), \
        load(trained / "recompute-1f1b-recompute" / "model.ckpt")
    assert_same_bits(graph, loop)
