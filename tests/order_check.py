"""What one compiled step runs, in the order it runs it, on each of 2 ranks (M=4): each
virtual stage's block marks its F and its input gradient (B, or I) from inside the graph
(a Python operator), the wire marks each send and receive. Prints `rank R ran: ...` and
`rank R's list: ...`.

    mpiexec -n 2 python tests/order_check.py SCHEDULE"""
import sys

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.config import PipelineConfig
from pipe.engine import PipelineEngine
from pipe.schedules import CHUNKS_PER_STAGE
from pipe.wire import MpiWire

RAN = []


def marker(kind):
    """An operator passing x through that notes `kind` when the graph runs it."""
    def note(x):
        RAN.append(kind)
        return x
    return ops.Custom(note, out_shape=lambda x: x, out_dtype=lambda x: x, func_type="pyfunc")


def marked(width_in, width_out):
    """A Dense, then a layer noting F as it runs, B as its gradient runs (a layer of its own,
    without weights: W, which reads what I kept, passes through no mark)."""
    return nn.SequentialCell([nn.Dense(width_in, width_out), Mark()])


class Mark(nn.Cell):
    def __init__(self):
        super().__init__()
        self.forward, self.backward = marker("F"), marker("B")

    def construct(self, x):
        return self.forward(x)

    def bprop(self, x, out, dout):
        return (self.backward(dout),)


class MarkedWire(MpiWire):
    def send_array(self, array, dst, tag):
        RAN.append("s")
        super().send_array(array, dst, tag)

    def recv_array(self, shape, dtype, src, tag):
        RAN.append("r")
        return super().recv_array(shape, dtype, src, tag)


ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
ms.set_seed(1)
schedule = sys.argv[1]
virtual_stages = 2 * CHUNKS_PER_STAGE.get(schedule, 1)          # a block each
blocks = [marked(6, 8)] + [marked(8, 8) for _ in range(virtual_stages - 2)] + [marked(8, 3)]
config = PipelineConfig(stages=2, micro_batches=4, batch_size=8, one_graph=True, schedule=schedule,
                        defer_wgrad=False, device="CPU")
engine = PipelineEngine(nn.SequentialCell(blocks),
                        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                        lambda params: nn.SGD(params, 0.1), config, MarkedWire())
rng = np.random.default_rng(0)
x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32)
engine.train_step(x, y)                  # (the first step also checks the stages: not noted)
RAN.clear()
engine.train_step(x, y)
rank, listed = engine.wire.rank, engine.schedule.actions[engine.layout.stage]
print(f"rank {rank} ran: {' '.join(RAN)}", flush=True)
print(f"rank {rank}'s list: {' '.join(map(str, listed))}", flush=True)
