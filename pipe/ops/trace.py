"""An opt-in timeline of what each rank did, as Chrome trace JSON (Perfetto, chrome://tracing).

    engine.tracer = Tracer(rank, "rank 0: stage 0", device)   # before the steps to record
    engine.tracer.write(f"trace.json.rank{rank}")             # every rank, after them
    merge_traces([f"trace.json.rank{r}" for r in range(world)], "trace.json")   # rank 0

Each span waits for the device before it is stamped (on CPU run PyNative synchronously);
with `wait_for_device=False` a span is the host's time issuing the action."""
import json
import os
import time
from contextlib import contextmanager

import mindspore as ms

__all__ = ["Tracer", "merge_traces"]


class Tracer:
    def __init__(self, rank, label, device, wait_for_device=True):
        self.rank, self.label, self.device = rank, label, device
        self.wait = wait_for_device and device != "CPU"
        self.events = []

    @contextmanager
    def span(self, name, **args):
        start = time.time()
        yield
        if self.wait:                  # queued device work must finish inside its span
            ms.runtime.synchronize()   # (on CPU: set_context(pynative_synchronize=True))
        end = time.time()
        self.events.append({"name": name, "ph": "X", "pid": self.rank, "tid": 0,
                            "ts": start * 1e6, "dur": (end - start) * 1e6, "args": args})

    def write(self, path):
        meta = {"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": self.label}}
        with open(path, "w") as f:
            json.dump({"traceEvents": [meta] + self.events}, f)


def merge_traces(parts, path):
    """Concatenate per-rank trace files into one, removing the parts."""
    events = []
    for part in parts:
        with open(part) as f:
            events += json.load(f)["traceEvents"]
        os.remove(part)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, path)
