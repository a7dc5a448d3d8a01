"""Whether MindSpore's Send holds the host: until its input is computed, or until the peer
receives. A reproduction with MindSpore's own operators, two GPUs:

    msrun --worker_num=2 --local_worker_num=2 --join=True --log_dir=logs benchmarks/send_wait.py

Rank 0 sends to rank 1 with ops.Send over NCCL (PyNative, through pipe's wire) and prints the
host's milliseconds in the Send call, the median of 20, in these cases:
  after-work  a Send just after issuing 20 products whose result it sends, the peer waiting
  graph       the same Send compiled, as the one-graph mode's messages are (pipe.compiled)
  add         an add in place of the Send, after the same work (no Send: the control)
  ready       a Send of a tensor already computed, the peer waiting
  late-peer   the same, the peer posting its Receive 30 ms later
  int32       an int32 (4, 512) tensor already computed (the GPT's mask), the peer waiting
A Send that waits for its input takes the work's device time in "after-work"; one that waits
for its peer takes 30 ms in "late-peer"; "add" shows the host free to run ahead of the work
(docs/performance.md, "Where a step goes").
"""
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
import cli  # noqa: E402
from cli import Parser, use_device  # noqa: E402


def parser():
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["GPU", "Ascend"], default="GPU")
    p.add_argument("--repeats", type=int, default=20)
    return p


if __name__ == "__main__":   # the flags answered before MindSpore loads (seconds)
    PARSER = parser()
    ARGS = PARSER.parse_args()

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from pipe.compiled import Compiled  # noqa: E402
from pipe.wire import MindSporeWire  # noqa: E402

CASES = ("after-work", "graph", "add", "ready", "late-peer", "int32")
AFTER_WORK = ("after-work", "graph", "add")       # the cases that send what was just issued


class SendCell(nn.Cell):
    """One Send, to be compiled."""

    def __init__(self, send):
        super().__init__(auto_prefix=False)
        self.send = send

    def construct(self, x):
        return self.send(x)


def main(args, p):
    device = use_device(args.device, memory_plan=False)
    if os.environ.get("MS_WORKER_NUM") != "2":
        p.error("it needs two processes under msrun: msrun --worker_num=2 --local_worker_num=2 "
                "--join=True benchmarks/send_wait.py")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    wire = MindSporeWire(device)
    a = ms.Tensor(np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))
    mask = ms.Tensor(np.ones((4, 512), np.int32))

    def sync():
        wire.all_reduce(ms.Tensor([0], ms.int32), (0, 1)).asnumpy()

    def work(x):
        for _ in range(20):
            x = ops.matmul(x, a) * 1e-3
        return x

    def device_ms():
        sync()
        start = time.perf_counter()
        work(a).asnumpy()
        return (time.perf_counter() - start) * 1e3

    results = {"the work (device, waited for)": [device_ms() for _ in range(5)]}
    send = {"graph": Compiled(SendCell(ops.Send(7, 1, group=wire.world))),
            "add": lambda y: y + 1}
    for case in CASES:
        results[case] = [host_ms(case, wire, work, sync, a, mask, send)
                         for _ in range(args.repeats)]
    if wire.rank == 0:
        for case, times in results.items():
            print(f"{case:30s} host {statistics.median(times):8.3f} ms (least {min(times):.3f})",
                  flush=True)


def host_ms(case, wire, work, sync, a, mask, send):
    """One Send of `case` from rank 0 to rank 1: rank 0's host milliseconds in the call."""
    x = mask if case == "int32" else (a if case in AFTER_WORK else work(a))
    if case not in AFTER_WORK:
        x.asnumpy()                      # computed before the Send
    sync()
    took = 0.0
    if wire.rank == 0:
        y = work(x) if case in AFTER_WORK else x
        start = time.perf_counter()
        send.get(case, lambda t: wire.send(t, 1, 7))(y)
        took = (time.perf_counter() - start) * 1e3
    elif case != "add":
        if case == "late-peer":
            time.sleep(0.03)
        wire.recv(x.shape, x.dtype, 0, 7).asnumpy()
    sync()
    return took


if __name__ == "__main__":
    cli.run(lambda: main(ARGS, PARSER))
