"""The chunk pipe runs: core's (pipe.core.chunk) with every layer feature plugged in.

Each feature overrides a seam of core's chunk and calls core through `super()`:
dropout masks (pipe.dropout), ReLU keeping its output (pipe.relu), the split backward's
I and W (pipe.split_backward), batch norm's buffers (pipe.batchnorm), float16 compute
(pipe.precision), and with `RecomputedChunk` activation recomputation (pipe.recompute).
The loss a backward starts from is `loss_fn`'s scalar or the sum of its (sum, count)
(pipe.normalized_loss).
"""
import mindspore as ms

from pipe.batchnorm import BatchNorm
from pipe.core import chunk as core
from pipe.core.chunk import arguments
from pipe.dropout import Dropout
from pipe.memory import Held
from pipe.normalized_loss import LossTerm
from pipe.precision import MixedPrecision, to_half
from pipe.predict import Infer
from pipe.recompute import Recompute
from pipe.relu import ReluKeepsOutput
from pipe.split_backward import SplitBackward, split_cells

__all__ = ["Chunk", "RecomputedChunk"]


class Chunk(BatchNorm, SplitBackward, MixedPrecision, Dropout, ReluKeepsOutput,
            core.Chunk):
    """`first_layer` is the chunk's place in the whole model: `named[k]`, (layer of the
    model, leaf within it) of leaf layer k, names its dropout masks and its errors.
    `half`: its layers compute in float16 (pipe.precision)."""

    def __init__(self, layers, loss_fn=None, is_first=True, grad_scale=1.0, first_layer=0,
                 half=False):
        self.named = [(first_layer + i, j) for i, layer in enumerate(layers)
                      for j in range(len(core.leaves([layer])))]
        self.half = half
        super().__init__(layers, None if loss_fn is None else LossTerm(loss_fn), is_first, grad_scale)
        if half:
            to_half(self.layers)
        self.input_grad_cell, self.weight_grad_cell = split_cells(self)
        self.infer_cell = Infer(self.layers)
        self.memory = {"held": 0, "peak": 0}          # bytes in flight, now and at most
        self.batch_shapes = None                      # this step's micro-batch shapes (the engine's)
        self.applied_scale = grad_scale               # grad_scale's value, on the host
        self.residuals = Held(self.memory, lambda: self.batch_shapes)    # (pipe.memory)
        self.waiting = Held(self.memory, lambda: self.batch_shapes)

    def start_step(self, grad_scale, draws, batch_shapes):
        """A step starts: its loss gradient's scale (pipe.engine.loss_weight, x S in fp16),
        its dropout masks' draws, its micro-batch shapes; gradient sums start anew."""
        if self.applied_scale != grad_scale:
            self.grad_scale, self.applied_scale = ms.Tensor(grad_scale, ms.float32), grad_scale
        self.draws, self.batch_shapes = draws, batch_shapes
        self.zero_grads()

    @property
    def state(self):
        """What a checkpoint holds of this chunk: parameters, then buffers."""
        return self.params + self.buffers

    @property
    def peak_bytes(self):
        return self.memory["peak"]

    def infer(self, x):
        """Forward only, in eval mode, keeping nothing: the model's output on the last chunk."""
        self.set_mode(False)
        return self.infer_cell(*arguments(x))


class RecomputedChunk(Recompute, Chunk):
    """A chunk whose micro-batches in flight keep only their input."""
