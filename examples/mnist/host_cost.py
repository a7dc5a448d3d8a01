"""Host cost per compiled call on this device: arguments, outputs, mutable tuples, nbytes."""
import statistics, sys, time
import mindspore as ms, numpy as np
from mindspore import nn, ops
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device(sys.argv[1] if len(sys.argv) > 1 else "GPU")
dense = nn.Dense(1024, 1024)

class One(nn.Cell):
    def __init__(self):
        super().__init__(); self.d = dense
    @ms.jit
    def construct(self, x):
        return self.d(x)

class Many(nn.Cell):
    def __init__(self):
        super().__init__(); self.d = dense
    @ms.jit
    def construct(self, x, *rest):
        return (self.d(x),) + tuple(r * 1.0 for r in rest)

class Mut(nn.Cell):
    def __init__(self):
        super().__init__(); self.d = dense
    @ms.jit
    def construct(self, x, rest):
        return (self.d(x),) + tuple(r * 1.0 for r in rest)

x = ms.Tensor(np.ones((64, 1024), np.float32))
rest = tuple(ms.Tensor(np.ones((64, 1024), np.float32)) for _ in range(8))
one, many, mut = One(), Many(), Mut()
def host_us(call, n=300):
    for _ in range(10): call()
    ms.runtime.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); call(); ts.append(time.perf_counter() - t)
    ms.runtime.synchronize()
    return statistics.median(ts) * 1e6
print("host us per call (median of 300, not waiting for the device):")
print(f"  1 arg, 1 output               {host_us(lambda: one(x)):7.1f}")
print(f"  9 args, 9 outputs (*args)     {host_us(lambda: many(x, *rest)):7.1f}")
print(f"  1 + mutable tuple of 8        {host_us(lambda: mut(x, ms.mutable(rest))):7.1f}")
out = one(x)
print(f"  Tensor.nbytes of an output    {host_us(lambda: one(x).nbytes) - host_us(lambda: one(x)):7.1f} (extra)")
print(f"  Tensor.shape of an output     {host_us(lambda: one(x).shape) - host_us(lambda: one(x)):7.1f} (extra)")
print(f"  ops.zeros(1024, 1024)         {host_us(lambda: ops.zeros((1024, 1024), ms.float32)):7.1f}")
