"""A deadline for wires that cannot time out by themselves (NCCL/HCCL sends and receives).

The engine arms it with `progress(where)` as it starts each action of a step and `pause()`s
it between steps, so only the engine's own work is timed (not the user's code, nor the first
step, which compiles). If no progress comes for `timeout` seconds while armed, it prints
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
        threading.Thread(target=self._watch, daemon=True).start()

    def progress(self, where):
        self.where, self.last, self.armed = where, time.monotonic(), True

    def pause(self):
        self.armed = False

    def _watch(self):
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            if self.armed and time.monotonic() - self.last > self.timeout:
                print(f"error: no progress for {self.timeout:g} s: {self.describe(self.where)}",
                      file=sys.stderr, flush=True)
                os._exit(1)
