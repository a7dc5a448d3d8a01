"""Waits that end: a deadline on every CPU wait, and a failing rank that tells the others.

`DeadlineWire` polls each wait: no progress for `timeout` seconds raises `WireTimeout`, and
a rank that fails sends every other a notice (`abort`) that every wait polls for, so a
peer stops at once (`PeerFailed`). NCCL/HCCL waits cannot time out: there the watchdog
keeps the deadline (pipe.ops.watchdog)."""
import os
import sys
import time

from pipe.ops.watchdog import PeerFailed, WireTimeout
from pipe.wire import MindSporeWire, MpiWire, SoloWire

__all__ = ["DeadlineWire", "connect"]


class DeadlineWire(MpiWire):
    """mpi4py on CPU, every wait polled against a deadline and for a peer's failure notice."""

    NOTICE = 32767                       # the tag of a failure notice (MPI allows at least this)

    def __init__(self, timeout, communicator=None):
        super().__init__(communicator)
        self.timeout = timeout

    def wait(self, request, what):
        """Poll until done, the pause doubling up to 1 ms (a long wait leaves the CPU to others)."""
        deadline, pause = time.monotonic() + self.timeout, 20e-6
        while not request.Test():
            status = self.MPI.Status()
            if self.world.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.NOTICE, status=status):
                peer = status.Get_source()
                notice = self.world.recv(source=peer, tag=self.NOTICE)
                raise PeerFailed(f"rank {self.rank} stopped waiting to {what}: rank {peer} "
                                 f"failed ({notice}); rank {peer}'s error says why")
            if time.monotonic() > deadline:     # (not cancelled: the job is ended next)
                raise WireTimeout(f"rank {self.rank}: no progress for {self.timeout:g} s while "
                                  f"waiting to {what}")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def abort(self, code, reason="", grace=2.0):
        """End every process of the job: a notice of `reason` to every rank, a moment for
        peers to say where they were, then MPI's Abort."""
        self.notices = [self.world.isend(reason or "it ended", dest=peer, tag=self.NOTICE)
                        for peer in range(self.size) if peer != self.rank]   # kept until Abort
        sys.stderr.flush()
        time.sleep(grace)
        self.world.Abort(code)


def connect(device, timeout):
    """This process's wire: mpi4py with deadlines on CPU (under `mpiexec`), MindSpore's on
    GPU or Ascend under `msrun` (MS_ROLE), even for one worker: msrun also runs the script as
    its scheduler, which only `init()` turns into one; one process alone talks to no one."""
    if device == "CPU":
        wire = DeadlineWire(timeout)
        return wire if wire.size > 1 else SoloWire()
    return MindSporeWire(device) if "MS_ROLE" in os.environ else SoloWire()
