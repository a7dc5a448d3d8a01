"""Pipeline inference returns the single-process forward: on every rank with result
broadcast, on the last stage only without it (tests/predict_check.py)."""
import pytest

from launch import run_check


@pytest.mark.parametrize("stages,data_parallel", [(3, 1), (2, 2)])
def test_predict_matches_single_process(stages, data_parallel):
    done = run_check("predict_check.py", stages * data_parallel, stages, data_parallel)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank, out in enumerate(done.outs):
        last = rank % stages == stages - 1
        assert out == f"rank {rank}: broadcast outputs equal; own outputs {'equal' if last else 'None'}\n"
