"""Pipeline inference returns the single-process forward: on every rank with result
broadcast, on the last stage only without it (tests/predict_check.py)."""
import pytest

from launch import run_check


@pytest.mark.parametrize("stages,dp", [(3, 1), (2, 2)])
def test_predict_matches_single_process(stages, dp):
    done = run_check("predict_check.py", stages * dp, stages, dp)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank"))
    last = [r for r in range(stages * dp) if r % stages == stages - 1]
    assert lines == sorted(f"rank {r}: broadcast outputs equal; own outputs "
                           f"{'equal' if r in last else 'None'}" for r in range(stages * dp))
