"""Whether MindSpore's Send holds the host: until its input is computed, or until the peer
receives. A reproduction with MindSpore's own operators, two GPUs:

    msrun --worker_num=2 --local_worker_num=2 --join=True --log_dir=logs benchmarks/send_wait.py

Rank 0 sends to rank 1 with ops.Send over NCCL (PyNative, through pipe's wire) and prints the
host's milliseconds in the Send call, the median of 20, in four cases:
  after-work  a Send just after issuing 20 products whose result it sends, the peer waiting
  ready       a Send of a tensor already computed, the peer waiting
  late-peer   the same, the peer posting its Receive 30 ms later
  int32       an int32 (4, 512) tensor already computed (the GPT's mask), the peer waiting
A Send that waits for its input takes the work's device time in "after-work"; one that waits
for its peer takes 30 ms in "late-peer" (docs/performance.md, "Where the GPT's step goes").
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import ops  # noqa: E402

from pipe.ops import cli  # noqa: E402
from pipe.ops.cli import Parser, use_device  # noqa: E402
from pipe.wire import MindSporeWire  # noqa: E402

CASES = ("after-work", "ready", "late-peer", "int32")


def main():
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["GPU", "Ascend"], default="GPU")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
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
    for case in CASES:
        results[case] = [host_ms(case, wire, work, sync, a, mask) for _ in range(args.repeats)]
    if wire.rank == 0:
        for case, times in results.items():
            print(f"{case:30s} host {statistics.median(times):8.3f} ms (least {min(times):.3f})",
                  flush=True)


def host_ms(case, wire, work, sync, a, mask):
    """One Send of `case` from rank 0 to rank 1: rank 0's host milliseconds in the call."""
    x = mask if case == "int32" else (a if case == "after-work" else work(a))
    if case != "after-work":
        x.asnumpy()                      # computed before the Send
    sync()
    took = 0.0
    if wire.rank == 0:
        y = work(x) if case == "after-work" else x
        start = time.perf_counter()
        wire.send(y, 1, 7)
        took = (time.perf_counter() - start) * 1e3
    else:
        if case == "late-peer":
            time.sleep(0.03)
        wire.recv(x.shape, x.dtype, 0, 7).asnumpy()
    sync()
    return took


if __name__ == "__main__":
    cli.run(main)
