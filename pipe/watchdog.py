"""A deadline for wires that cannot time out by themselves (NCCL/HCCL sends and receives).

The engine calls `progress(where)` before each action. If no call comes for `timeout`
seconds, the watchdog prints where this rank is stuck and ends the process, so a dead peer
turns into a prompt, explained failure instead of a hang inside a receive.
"""
import os
import sys
import threading
import time

__all__ = ["Watchdog"]


class Watchdog:
    def __init__(self, timeout, describe):
        self.timeout, self.describe = timeout, describe   # describe(where) -> report text
        self.where, self.last = "start-up", time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()

    def progress(self, where):
        self.where, self.last = where, time.monotonic()

    def _watch(self):
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            if time.monotonic() - self.last > self.timeout:
                print(f"error: no progress for {self.timeout:g} s: {self.describe(self.where)}",
                      file=sys.stderr, flush=True)
                os._exit(1)
