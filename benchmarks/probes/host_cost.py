"""Host cost of one compiled call on this device: arguments, outputs, tuples, metadata.

    python benchmarks/probes/host_cost.py GPU

Each figure is the median time the host spends issuing a call, not waiting for the device
(benchmarks/log.md, section 6). accumulate_cost.py uses the same clock.
"""
import statistics
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops


def host_us(call, n=300):
    """Median microseconds the host spends in `call()` (the device drained before and after)."""
    for _ in range(10):
        call()
    ms.runtime.synchronize()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    ms.runtime.synchronize()
    return statistics.median(times) * 1e6


class Dense(nn.Cell):
    """x -> dense(x), and each further argument times 1.0 as a further output."""

    def __init__(self, dense):
        super().__init__()
        self.dense = dense

    @ms.jit
    def construct(self, x, *rest):
        return (self.dense(x),) + tuple(r * 1.0 for r in rest)


class DenseTuple(Dense):
    """The same with the further arguments as one (mutable) tuple."""

    @ms.jit
    def construct(self, x, rest):
        return (self.dense(x),) + tuple(r * 1.0 for r in rest)


def main(device):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device(device)
    dense = nn.Dense(1024, 1024)
    plain, packed = Dense(dense), DenseTuple(dense)
    x = ms.Tensor(np.ones((64, 1024), np.float32))
    rest = tuple(ms.Tensor(np.ones((64, 1024), np.float32)) for _ in range(8))
    print("host us per call (median of 300, not waiting for the device):")
    print(f"  1 arg, 1 output               {host_us(lambda: plain(x)):7.1f}")
    print(f"  9 args, 9 outputs (*args)     {host_us(lambda: plain(x, *rest)):7.1f}")
    print(f"  1 + mutable tuple of 8        {host_us(lambda: packed(x, ms.mutable(rest))):7.1f}")
    bare = host_us(lambda: plain(x))
    print(f"  Tensor.nbytes of an output    {host_us(lambda: plain(x)[0].nbytes) - bare:7.1f} (extra)")
    print(f"  Tensor.shape of an output     {host_us(lambda: plain(x)[0].shape) - bare:7.1f} (extra)")
    print(f"  ops.zeros(1024, 1024)         {host_us(lambda: ops.zeros((1024, 1024), ms.float32)):7.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "GPU")
