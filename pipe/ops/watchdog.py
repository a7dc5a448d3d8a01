"""Where this rank is in its step, said when something fails or stalls there.

Every piece of a step that may wait on peers runs inside `Watch.at(position)`: an error in
it becomes a `PipelineError` naming the rank, stage, replica and action, and an uncaught
error ends the whole job (`end_job_on_uncaught`). Wires that cannot time out themselves
(NCCL/HCCL) also get a `Watchdog`, armed while pipe's own work runs (not the user's code,
nor a schedule's first step, which compiles): with no progress for `timeout` seconds it
prints where this rank is stuck and ends the process."""
import os
import sys
import threading
import time
from contextlib import contextmanager

from pipe.ops.simulator import format_position

__all__ = ["PipelineError", "PeerFailed", "WireTimeout", "Watch", "Watchdog",
           "end_job_on_uncaught", "end_job", "first_line", "alike_on_every_rank", "alike",
           "is_alike"]


PEER_GRACE = 30.0    # seconds a rank told of a peer's failure waits for that peer to end the job


class PeerFailed(RuntimeError):
    """Another rank failed and this one stops rather than wait: that rank's error says why."""


class WireTimeout(RuntimeError):
    """A send, receive or all-reduce saw no progress for `timeout` seconds."""


@contextmanager
def alike_on_every_rank():
    """Mark a mistake raised in this block as raised alike on every rank (the config, the
    launch's size, the whole model), so that a program says it once, on rank 0."""
    try:
        yield
    except (ValueError, TypeError) as error:
        alike(error)
        raise


def alike(error):
    """`error`, marked as raised alike on every rank."""
    error.on_every_rank = True
    return error


def is_alike(error):
    return getattr(error, "on_every_rank", False)


def end_job(wire, code, reason="", grace=2.0):
    """End every process of the job: through the wire's notices on CPU (after `grace`
    seconds for peers to say where they were); on GPU/Ascend by exiting (msrun ends the rest)."""
    if hasattr(wire, "abort"):
        wire.abort(code, reason, grace)
    if wire.size == 1:
        sys.exit(code)
    os._exit(code)


def first_line(error):
    """An error in one line, as a failure notice carries it (a PipelineError's cause)."""
    if isinstance(error, PipelineError) and error.__cause__ is not None:
        error = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def end_job_on_uncaught(wire):
    """Make an exception no one catches end the whole job, not only this process (as
    `python -m mpi4py` does): printed as usual (a mistake raised alike on every rank, by rank 0
    alone), then every rank is told and the job ends."""
    previous = getattr(sys.excepthook, "previous", sys.excepthook)

    def hook(kind, error, trace):
        peer_failed = isinstance(error, PeerFailed)
        if peer_failed:
            print(f"error: {error}", file=sys.stderr, flush=True)
        elif not (is_alike(error) and wire.rank):    # (raised alike on every rank: rank 0 says it)
            previous(kind, error, trace)
        sys.stdout.flush()               # (a GPU wire's abort ends the process at once)
        # A peer's failure is already ending the job: its abort ends this process, not ours.
        end_job(wire, 1, first_line(error), grace=PEER_GRACE if peer_failed else 2.0)
    hook.previous = previous
    sys.excepthook = hook


class PipelineError(RuntimeError):
    """An action failed on this rank (or a peer stopped answering); says where.
    `abort()` ends every process of the job: peers may be waiting for this one."""

    def __init__(self, message, wire):
        super().__init__(message)
        self.wire = wire

    def abort(self, code=1):
        end_job(self.wire, code, first_line(self))


class Watch:
    """This rank's position in its step: text ("a barrier") or (schedule, action index)."""

    def __init__(self, wire, stage, replica, timeout):
        self.wire, self.stage = wire, stage
        self.head = f"rank {wire.rank} (stage {stage}, replica {replica})"
        ends = wire.size == 1 or hasattr(wire, "abort")   # (its own waits end: a DeadlineWire)
        self.watchdog = None if ends else Watchdog(timeout, self.describe)

    def begin(self, schedule):
        if self.watchdog:
            self.watchdog.begin(schedule.name)

    def at(self, position):
        """A piece that may wait on peers: timed (if a watchdog runs), failures reported."""
        if self.watchdog:
            self.watchdog.progress(position)
        return self.reported(position)

    @contextmanager
    def reported(self, position, catch=Exception):
        try:
            yield
        except PeerFailed:               # another rank's error: it says where
            raise
        except catch as e:
            raise PipelineError(f"{e}\n{self.describe(position)}", self.wire) from e

    def end(self, schedule):
        """Between steps the user's code runs: nothing to time."""
        if self.watchdog:
            self.watchdog.pause(schedule.name)

    def describe(self, position):
        if not isinstance(position, tuple):
            return f"{self.head} was in {position}"
        schedule, i = position
        return (f"{self.head} was at action {i} ({schedule.actions[self.stage][i]}) of its "
                f"{schedule.name} schedule:\n{format_position(schedule, self.stage, i)}")


class Watchdog:
    def __init__(self, timeout, describe):
        self.timeout, self.describe = timeout, describe   # describe(where) -> report text
        self.where, self.last, self.armed = None, time.monotonic(), False
        self.compiled, self.timed = set(), True   # kinds of step run once; is this one timed
        threading.Thread(target=self._watch, daemon=True).start()

    def begin(self, kind):
        self.timed = kind in self.compiled

    def progress(self, where):
        if self.timed:
            self.where, self.last, self.armed = where, time.monotonic(), True

    def pause(self, kind=None):
        """Between steps: nothing is timed. `kind`: the step that ended (now compiled)."""
        self.armed = False
        if kind is not None:
            self.compiled.add(kind)

    def _watch(self):
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            if self.armed and time.monotonic() - self.last > self.timeout:
                print(f"error: no progress for {self.timeout:g} s: {self.describe(self.where)}",
                      file=sys.stderr, flush=True)
                os._exit(1)
