"""The watchdog that gives NCCL/HCCL waits a deadline, run on its own (CPU, no GPU needed)."""
import subprocess
import sys
import time

SCRIPT = """
import time
from pipe.watchdog import Watchdog
dog = Watchdog(1.0, lambda where: f"rank 0 was at {{where}}")
{body}
print("finished", flush=True)
"""


def run(body):
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(body=body)], capture_output=True,
                          text=True, timeout=30)
    return done, time.monotonic() - start


def test_a_stuck_wait_ends_the_process_with_where_it_was():
    done, elapsed = run('dog.progress("rB3")\ntime.sleep(10)')
    assert done.returncode == 1 and elapsed < 5
    assert "error: no progress for 1 s: rank 0 was at rB3" in done.stderr
    assert "finished" not in done.stdout


def test_a_paused_watchdog_lets_user_code_take_its_time():
    done, _ = run('dog.progress("optimizer")\ndog.pause()\ntime.sleep(2.5)')
    assert done.returncode == 0 and "finished" in done.stdout


def test_progress_keeps_it_quiet():
    done, _ = run('for i in range(6):\n    dog.progress(i)\n    time.sleep(0.4)')
    assert done.returncode == 0 and "finished" in done.stdout
