"""Ctrl-C while rank 0 is inside a call that Python cannot interrupt, as a compiled step.

    mpiexec -n 2 python tests/ctrl_c_check.py DIR

Both ranks handle Ctrl-C as the examples do (examples/cli.py) and print `ready`. Rank 0
then blocks in MPI's receive, where no signal handler runs, until rank 1 sends: rank 1's
helper thread does so once the file DIR/release exists. Rank 0's line can only come after
that, so rank 1 must not stop first (the launcher would end rank 0 before it speaks).
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from cli import PROGRESS, stop_on_ctrl_c  # noqa: E402

stop_on_ctrl_c()
from mpi4py import MPI  # noqa: E402

world = MPI.COMM_WORLD
PROGRESS.at = "during step 1 of 1"
release = os.path.join(sys.argv[1], "release")


def send_once_released():
    while not os.path.exists(release):
        time.sleep(0.01)
    world.send("go", dest=0)


if world.rank == 1:
    threading.Thread(target=send_once_released, daemon=True).start()
print("ready", flush=True)
if world.rank == 0:
    world.recv(source=1)                 # (Ctrl-C's handler runs as it returns)
while True:
    time.sleep(1)
