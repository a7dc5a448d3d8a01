"""Host cost of accumulating 8 gradients: in place into Parameters vs returned (functional)."""
import statistics, sys, time
import mindspore as ms, numpy as np
from mindspore import nn, ops
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device(sys.argv[1] if len(sys.argv) > 1 else "GPU")
shape = (1024, 1024)
grads = tuple(ms.Tensor(np.ones(shape, np.float32)) for _ in range(8))

class InPlace(nn.Cell):
    def __init__(self):
        super().__init__()
        self.acc = ms.ParameterTuple(ms.Parameter(ops.zeros(shape, ms.float32), name=f"a{i}", requires_grad=False) for i in range(8))
    @ms.jit
    def construct(self, first, *g):
        out = ()
        for i, a in enumerate(self.acc):
            out = out + ((ops.assign(a, g[i]) if first else ops.assign_add(a, g[i])),)
        return out

class InPlaceNoOut(nn.Cell):
    def __init__(self):
        super().__init__()
        self.acc = ms.ParameterTuple(ms.Parameter(ops.zeros(shape, ms.float32), name=f"b{i}", requires_grad=False) for i in range(8))
    @ms.jit
    def construct(self, first, *g):
        for i, a in enumerate(self.acc):
            if first:
                ops.assign(a, g[i])
            else:
                ops.assign_add(a, g[i])
        return g[0] * 1.0

class Functional(nn.Cell):
    @ms.jit
    def construct(self, acc, *g):
        return tuple(acc[i] + g[i] for i in range(8))

def host_us(call, n=200):
    for _ in range(10): call()
    ms.runtime.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); call(); ts.append(time.perf_counter() - t)
    ms.runtime.synchronize()
    return statistics.median(ts) * 1e6
a, b, f = InPlace(), InPlaceNoOut(), Functional()
acc = tuple(ops.zeros(shape, ms.float32) for _ in range(8))
print("host us per call, 8 gradients of 1024x1024:")
print(f"  in place, returns the 8 written   first={host_us(lambda: a(True, *grads)):7.1f}  add={host_us(lambda: a(False, *grads)):7.1f}")
print(f"  in place, returns one tensor      first={host_us(lambda: b(True, *grads)):7.1f}  add={host_us(lambda: b(False, *grads)):7.1f}")
print(f"  functional: mutable(acc) in, out  {host_us(lambda: f(ms.mutable(acc), *grads)):7.1f}")
print(f"  in place alternating first/add    {host_us(lambda: (b(True, *grads), b(False, *grads))) / 2:7.1f}")
