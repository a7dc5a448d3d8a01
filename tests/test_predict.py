"""Pipeline inference returns the single-process forward: on every rank with result
broadcast, on the last stage only without it."""
import subprocess
import sys

import pytest

from launch import ENV, ROOT


@pytest.mark.parametrize("stages,dp", [(3, 1), (2, 2)])
def test_predict_matches_single_process(stages, dp):
    done = subprocess.run(["mpiexec", "-n", str(stages * dp), sys.executable, "tests/predict_check.py",
                           str(stages), str(dp)], capture_output=True, text=True, env=ENV,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank"))
    last = [r for r in range(stages * dp) if r % stages == stages - 1]
    assert lines == sorted(f"rank {r}: broadcast outputs equal; own outputs "
                           f"{'equal' if r in last else 'None'}" for r in range(stages * dp))
