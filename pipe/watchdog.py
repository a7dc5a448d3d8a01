"""A deadline for wires that cannot time out by themselves (NCCL/HCCL sends and receives).

The engine announces each step with `begin(kind)`, arms it with `progress(where)` as it
starts each action and `pause(kind)`s it between steps, so only the engine's own work is
timed: not the user's code, nor the first step of each kind (a schedule), which compiles. If no progress comes for `timeout` seconds while armed, it prints
where this rank is stuck and ends the process: a dead peer becomes a prompt, explained
failure instead of a hang inside a receive.
"""
import os
import sys
import threading
import time

__all__ = ["Watchdog"]


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
