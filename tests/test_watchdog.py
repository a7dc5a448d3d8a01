"""The watchdog that gives NCCL/HCCL waits a deadline, run on its own (CPU, no GPU needed).

Each case is a short script in its own process. What is checked is whether the watchdog
fired, not how fast: a stuck script would otherwise sleep far past its deadline and say
"finished", and the quiet ones run past their deadline, pausing or reporting progress 10
times within each.
"""
import subprocess
import sys

import pytest

SCRIPT = """
import time
from pipe.ops.watchdog import Watchdog
dog = Watchdog({timeout}, lambda where: f"rank 0 was at {{where}}")
{body}
print("finished", flush=True)
"""


def run(body, timeout):
    return subprocess.run([sys.executable, "-c", SCRIPT.format(body=body, timeout=timeout)],
                          capture_output=True, text=True, timeout=120)


def test_a_stuck_wait_ends_the_process_with_where_it_was():
    done = run('dog.progress("rB3")\ntime.sleep(60)', timeout=1.0)
    assert done.returncode == 1
    assert "error: no progress for 1 s: rank 0 was at rB3" in done.stderr
    assert "finished" not in done.stdout


def test_a_paused_watchdog_lets_user_code_take_its_time():
    done = run('dog.progress("optimizer")\ndog.pause()\ntime.sleep(1.5)', timeout=0.5)
    assert done.returncode == 0 and "finished" in done.stdout


@pytest.mark.alone
def test_progress_keeps_it_quiet():
    done = run('for i in range(25):\n    dog.progress(i)\n    time.sleep(0.1)', timeout=1.0)
    assert done.returncode == 0 and "finished" in done.stdout


def test_the_first_step_of_a_kind_compiles_untimed_the_next_is_timed():
    body = ('dog.begin("1f1b")\ndog.progress("F0")\ntime.sleep(1.5)\ndog.pause("1f1b")\n'
            'dog.begin("1f1b")\ndog.progress("rB3")\ntime.sleep(60)')
    done = run(body, timeout=0.5)
    assert done.returncode == 1
    assert "error: no progress for 0.5 s: rank 0 was at rB3" in done.stderr
