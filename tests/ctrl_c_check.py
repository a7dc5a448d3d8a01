"""Ctrl-C while rank 0 is inside a call that Python cannot interrupt, as a compiled step,
here its first save into a folder that holds another run's checkpoint.

    mpiexec -n 2 python tests/ctrl_c_check.py DIR

Both ranks handle Ctrl-C as the examples do (examples/cli.py) and print `ready`. Rank 0
then saves into DIR/ckpt, blocked in MPI's receive, where no signal handler runs, until
rank 1 sends: rank 1's helper thread does so once the file DIR/release exists. Each rank's
DIR/got-ctrl-c-<rank> says when its Ctrl-C has landed. Rank 0's
line can only come after that, so rank 1 must not stop first (the launcher would end rank 0
before it speaks), and it names no checkpoint: the one in DIR/ckpt is not this run's.
"""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from cli import PROGRESS, save, stop_on_ctrl_c  # noqa: E402

stop_on_ctrl_c()
from mpi4py import MPI  # noqa: E402

world = MPI.COMM_WORLD
# Python's own C handler writes each signal's number here the moment it lands, before the
# Python handler can run (not until the receive below returns): the test waits for it.
signal.set_wakeup_fd(os.open(os.path.join(sys.argv[1], f"got-ctrl-c-{world.rank}"),
                             os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK))
PROGRESS.at = "during step 1 of 1"
release = os.path.join(sys.argv[1], "release")


def send_once_released():
    while not os.path.exists(release):
        time.sleep(0.01)
    world.send("go", dest=0)


class Engine:
    """Stands in for PipelineEngine: its save waits on the other rank, as a real one does."""

    def save(self, directory, step, meta=None):
        world.recv(source=1)             # (Ctrl-C's handler runs as it returns)


if world.rank == 1:
    threading.Thread(target=send_once_released, daemon=True).start()
print("ready", flush=True)
if world.rank == 0:
    save(Engine(), os.path.join(sys.argv[1], "ckpt"), 1)
while True:
    time.sleep(1)
