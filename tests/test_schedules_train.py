"""The schedules train the same weights as one process, for P in {2,4} and M = P or 2P
(P = 3 is in the simulator's tables and the CNN's ZB-H1 3x1), and each trains the same bits
run action by action or compiled as one graph per step (at P = 2).

The matrix trains in the one mpiexec launch this module shares with
tests/test_transparency.py (conftest.trained). The reference is one process training the whole batch at once; interleaved 1F1B, ZB-V and
DualPipeV need 2P virtual stages, so they train a deeper model (against its own reference).
"""
import os

import numpy as np
import pytest
from launch import load

FLAGS = ["--data", "synthetic", "--hidden", "16", "--batch-size", "48", "--steps", "2",
         "--seed", "3", "--optimizer", "sgd", "--lr", "0.1", "--no-eval"]
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"]
SIZES = {"gpipe": [(2, 2)], "1f1b": [(2, 2)],     # their other layouts: test_transparency
         "dualpipe-v": [(2, 4), (4, 8)]}   # M >= 2P
CASES = [(s, p, m) for s in SCHEDULES for p, m in SIZES.get(s, [(2, 2), (4, 8)])]  # M = P, 2P
GRAPH_CASES = [(s, p, m) for s, p, m in CASES if p == 2]


def depth(schedule):
    """Hidden layers: one block per virtual stage at P=4 (interleaved and the V shapes run 2
    chunks per rank)."""
    return 7 if schedule in ("interleaved-1f1b", "zb-v", "dualpipe-v") else 3


def matrix(root):
    """Every training this module checks (trained in one launch: conftest.trained)."""
    configs = [(1, FLAGS + ["--layers", layers, "--micro-batches", 1, "--save", root / f"single-{layers}"])
               for layers in sorted({depth(s) for s in SCHEDULES})]
    configs += [(p, FLAGS + ["--layers", depth(s), "--stages", p, "--micro-batches", m,
                             "--schedule", s, "--save", root / f"{s}-{p}-{m}"])
                for s, p, m in CASES]
    configs += [(p, FLAGS + ["--layers", depth(s), "--stages", p, "--micro-batches", m,
                             "--schedule", s, "--one-graph", "--save", root / f"{s}-{p}-{m}-graph"])
                for s, p, m in GRAPH_CASES]
    return configs


@pytest.fixture(scope="module")
def runs(trained):
    names = {os.path.basename(str(flags[-1])) for _, flags in matrix(trained)}
    return {name: load(trained / name / "model.ckpt") for name in names}


@pytest.mark.parametrize("schedule,stages,micro_batches", CASES)
def test_schedule_trains_like_one_process(runs, schedule, stages, micro_batches):
    got, want = runs[f"{schedule}-{stages}-{micro_batches}"], runs[f"single-{depth(schedule)}"]
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("schedule,stages,micro_batches", GRAPH_CASES)
def test_schedule_as_one_graph_trains_the_loops_bits(runs, schedule, stages, micro_batches):
    """One graph per step runs the loop's handlers, traced: the same weights, bit for bit."""
    name = f"{schedule}-{stages}-{micro_batches}"
    got, want = runs[f"{name}-graph"], runs[name]
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
