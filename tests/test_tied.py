"""A weight shared by the first and last stage (tied embedding and output head) trains like
one process, its copies stay bitwise equal after every step, and the merged checkpoint
loads into the unsplit model with nothing left out (tests/tied_check.py), here with two
replicas; tied layer builders across two stages: tests/test_gpt.py."""
import pytest

from launch import run_check


@pytest.mark.parametrize("stages,data_parallel", [(2, 2)])
def test_tied_weights_train_like_one_process(stages, data_parallel, tmp_path):
    done = run_check("tied_check.py", stages * data_parallel, stages, data_parallel, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.outs == [f"rank {r}: 5 steps, losses equal, tied copies bitwise equal, "
                         "checkpoint loads\n" for r in range(stages * data_parallel)]
