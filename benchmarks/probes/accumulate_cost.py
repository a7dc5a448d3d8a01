"""Host cost of accumulating 8 gradients: in place into Parameters, or passed and returned.

    python benchmarks/probes/accumulate_cost.py GPU

pipe passes its accumulators in and gets them back (functional); adding in place with
`ops.assign_add` was measured slower on the device too (benchmarks/log.md, section 6).
"""
import sys

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from host_cost import host_us

SHAPE, COUNT = (1024, 1024), 8


class InPlace(nn.Cell):
    """Writes (`first`) or adds each gradient into its Parameter; returns the written ones,
    or, with `returns_all` off, one unrelated tensor."""

    def __init__(self, name, returns_all):
        super().__init__()
        self.returns_all = returns_all
        self.accumulators = ms.ParameterTuple(
            ms.Parameter(ops.zeros(SHAPE, ms.float32), name=f"{name}{i}", requires_grad=False)
            for i in range(COUNT))

    @ms.jit
    def construct(self, first, *grads):
        written = ()
        for i, acc in enumerate(self.accumulators):
            written = written + ((ops.assign(acc, grads[i]) if first else ops.assign_add(acc, grads[i])),)
        return written if self.returns_all else grads[0] * 1.0


class Functional(nn.Cell):
    @ms.jit
    def construct(self, accumulators, *grads):
        return tuple(accumulators[i] + grads[i] for i in range(COUNT))


def main(device):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device(device)
    grads = tuple(ms.Tensor(np.ones(SHAPE, np.float32)) for _ in range(COUNT))
    accumulators = tuple(ops.zeros(SHAPE, ms.float32) for _ in range(COUNT))
    all_out, one_out, functional = InPlace("a", True), InPlace("b", False), Functional()
    print(f"host us per call, {COUNT} gradients of {SHAPE[0]}x{SHAPE[1]}:")
    for label, cell in (("in place, returns the 8 written", all_out),
                        ("in place, returns one tensor", one_out)):
        print(f"  {label:32s}  first={host_us(lambda: cell(True, *grads)):7.1f}  "
              f"add={host_us(lambda: cell(False, *grads)):7.1f}")
    passed = host_us(lambda: functional(ms.mutable(accumulators), *grads))
    print(f"  functional: mutable(acc) in, out  {passed:7.1f}")
    alternating = host_us(lambda: (one_out(True, *grads), one_out(False, *grads))) / 2
    print(f"  in place alternating first/add    {alternating:7.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "GPU")
