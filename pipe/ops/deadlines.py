"""Waits that end: a deadline on every CPU wait, and a failing rank that tells the others.

pipe.wire's `MpiWire` blocks in each wait. `DeadlineWire` polls instead: a wait with no progress
for `timeout` seconds raises `WireTimeout`, and a rank that fails first sends every other
rank a short notice (`abort`), on a tag of its own that every wait also polls for, so a
peer waiting on it stops at once with a line naming it (`PeerFailed`) instead of waiting
out its deadline. NCCL/HCCL waits cannot time out: there the watchdog (pipe.ops.watchdog)
keeps the deadline, and msrun ends the other workers when one exits with an error
(pipe.ops.watchdog.end_job).
"""
import sys
import time

from pipe.ops.watchdog import PeerFailed, WireTimeout
from pipe.wire import MpiWire, SoloWire
from pipe.wire import connect as launched_wire

__all__ = ["DeadlineWire", "connect"]


class DeadlineWire(MpiWire):
    """mpi4py on CPU, every wait polled against a deadline and for a peer's failure notice."""

    NOTICE = 32767                       # the tag of a failure notice (MPI allows at least this)

    def __init__(self, timeout, communicator=None):
        super().__init__(communicator)
        self.timeout = timeout

    def wait(self, request, what):
        """Poll until done. The pause doubles up to 1 ms: a quick message is taken at once,
        and a long wait (a peer compiling) leaves the CPU to the processes doing work."""
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
        """End every process of the job (a normal exit would wait for stuck peers): first
        a notice of `reason` to every rank, then a moment in which peers can say where they
        were."""
        self.notices = [self.world.isend(reason or "it ended", dest=peer, tag=self.NOTICE)
                        for peer in range(self.size) if peer != self.rank]   # kept until Abort
        sys.stderr.flush()
        time.sleep(grace)
        self.world.Abort(code)


def connect(device, timeout):
    """The wire for this process: on CPU, mpi4py with deadlines (one process without
    `mpiexec`); on GPU/Ascend, MindSpore's in a job `msrun` started (it sets MS_WORKER_NUM)."""
    if device != "CPU":
        return launched_wire(device)
    wire = DeadlineWire(timeout)
    return wire if wire.size > 1 else SoloWire()
