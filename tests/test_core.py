"""pipe.core alone: GPipe and 1F1B train what one process trains, and core stays whole.

`core_check.py` imports nothing from pipe outside pipe.core; its configurations train in
the suite's one launch (conftest.trained), and every rank's weights and losses are
compared here with TrainOneStepCell.
"""
import ast
import os

import mindspore as ms
import numpy as np
import pytest

from core_check import one_process
from launch import ROOT, results

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
CORE = os.path.join(ROOT, "pipe", "core")
LAYOUTS = [("gpipe", 2, 1), ("1f1b", 2, 1), ("gpipe", 3, 1), ("1f1b", 3, 1), ("gpipe", 2, 2),
           ("1f1b", 2, 2)]


def matrix(root):
    return [(p * d, {"model": "core", "save": str(root / f"core-{s}-{p}x{d}"),
                     "config": {"schedule": s, "stages": p, "data_parallel": d}})
            for s, p, d in LAYOUTS]


@pytest.fixture(scope="module")
def plain():
    return one_process()


@pytest.mark.parametrize("schedule,stages,data_parallel", LAYOUTS)
def test_core_alone_trains_gpipe_and_1f1b_as_one_process(trained, plain, schedule, stages,
                                                         data_parallel):
    want, want_losses = plain
    ranks = results(trained / f"core-{schedule}-{stages}x{data_parallel}")
    assert len(ranks) == stages * data_parallel
    for rank, got in ranks.items():
        np.testing.assert_allclose(got["losses"], want_losses, rtol=1e-6, err_msg=f"rank {rank}")
        for name, value in got["weights"].items():
            np.testing.assert_allclose(value, want[name], rtol=0, atol=1e-6, err_msg=name)


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
