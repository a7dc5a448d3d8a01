"""Pipelined training equals single-process training: same seed, same flags, same weights.

The reference is the example run as one plain process. The pipelines are real processes
started by mpiexec, all layouts in one launch (tests/mpi_worker.py), on the CPU wire.
"""
import os

import numpy as np
import pytest

from launch import load, results, run_many

FLAGS = ["--layers", "3", "--hidden", "32", "--batch-size", "16", "--micro-batches", "4",
         "--steps", "2", "--seed", "7", "--data", "synthetic"]
SGD = ["--optimizer", "sgd", "--lr", "0.1"]
# Adam divides by sqrt(second moment): a gradient at round-off level becomes a step of
# about lr. A small lr keeps that within the tolerance below.
ADAM = ["--optimizer", "adam", "--lr", "0.001"]
LAYOUTS = [(1, 2), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2)]
SCHEDULES = ["gpipe", "1f1b"]


def layout_flags(schedule, stages, dp):
    return ["--schedule", schedule, "--stages", stages, "--dp", dp]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Saved weights and every rank's results of every configuration, all in one launch:
    the references (one process), the weights before training, then the pipelines."""
    root = tmp_path_factory.mktemp("transparency")
    configs = [(1, FLAGS + SGD + ["--save", root / "single-sgd"]),
               (1, FLAGS + ADAM + ["--save", root / "single-adam"]),
               (1, FLAGS + SGD + ["--steps", 0, "--save", root / "initial"])]
    configs += [(p * d, FLAGS + SGD + layout_flags(s, p, d) + ["--save", root / f"{s}-{p}x{d}"])
                for s in SCHEDULES for p, d in LAYOUTS]
    configs.append((4, FLAGS + ADAM + layout_flags("1f1b", 2, 2) + ["--save", root / "adam-2x2"]))
    configs.append((1, FLAGS + SGD + layout_flags("gpipe", 1, 1) + ["--save", root / "gpipe-1x1"]))
    configs.append((2, FLAGS + SGD + layout_flags("1f1b", 2, 1) + ["--partition", "time", "--save", root / "time-2x1"]))
    done = run_many(configs)
    assert done.returncode == 0, done.stderr[-3000:]
    return {entry: (load(root / entry / "model.ckpt"), results(root / entry))
            for entry in os.listdir(root)}


def assert_same_weights(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("stages,dp", LAYOUTS)
def test_pipeline_equals_single_process(runs, schedule, stages, dp):
    assert_same_weights(runs[f"{schedule}-{stages}x{dp}"][0], runs["single-sgd"][0])


def test_single_stage_schedules_agree(runs):
    assert_same_weights(runs["gpipe-1x1"][0], runs["single-sgd"][0])


def test_time_balanced_partition_equals_single_process(runs):
    """Every rank times the layers, the mean decides the split: the ranks must agree."""
    assert_same_weights(runs["time-2x1"][0], runs["single-sgd"][0])


def test_adam_pipeline_equals_single_process(runs):
    assert_same_weights(runs["adam-2x2"][0], runs["single-adam"][0])


def test_weights_moved(runs):
    """Guards the test itself: training really changed the weights."""
    start, trained = runs["initial"][0], runs["single-sgd"][0]
    assert max(np.abs(trained[k] - start[k]).max() for k in start) > 1e-3


@pytest.mark.parametrize("stages,dp", [(4, 1), (2, 2)])
def test_every_rank_returns_the_single_process_loss(runs, stages, dp):
    """The step's loss lives on the last stages; every rank must return it, bitwise the same."""
    got = {rank: result["losses"] for rank, result in runs[f"1f1b-{stages}x{dp}"][1].items()}
    want = runs["single-sgd"][1][0]["losses"]
    assert sorted(got) == list(range(stages * dp)) and len(want) == 2
    assert all(got[r] == got[0] for r in got)
    np.testing.assert_allclose(got[0], want, rtol=1e-6)
