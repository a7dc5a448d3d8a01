"""A weight shared by the first and last stage (tied embedding and output head) trains like
one process, and its copies stay bitwise equal after every step (tests/tied_check.py)."""
import pytest

from launch import run_check


@pytest.mark.parametrize("stages,data_parallel", [(3, 1), (2, 2)])
def test_tied_weights_train_like_one_process(stages, data_parallel):
    done = run_check("tied_check.py", stages * data_parallel, stages, data_parallel)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.outs == [f"rank {r}: 5 steps, losses equal, tied copies bitwise equal\n"
                         for r in range(stages * data_parallel)]
