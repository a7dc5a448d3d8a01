"""Dropout masks drawn on the host from (seed, step, layer, sample): every layout draws the same.

MindSpore's dropout draws its mask inside the compiled graph, from the kernel's own
generator: how a sample is dropped then depends on how the batch was cut into micro-batches
and in which order they ran, and pipe's backward, which runs a layer again, would draw
another. Here a dropout layer's mask for a whole step is a function of the seed, the step
number, the layer's place in the whole model and the sample's row in the global batch; a
micro-batch takes its rows of it. The forward takes the masks as the chunk's `extras` and
keeps each dropout's mask instead of its input; the backward multiplies by the same mask.
One process, 4 stages x 2 replicas and any number of micro-batches drop the same units.
"""
from dataclasses import dataclass
from functools import cached_property

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.core.chunk import LayerGrad, arguments
from pipe.core.wire import spec_of

__all__ = ["MaskDraw", "Dropout", "draws"]


@dataclass(frozen=True)
class MaskDraw:
    """Where one micro-batch's dropout masks come from."""
    seed: int
    step: int            # the optimizer step, 1 for the first
    rows: slice          # this micro-batch's rows of the global batch
    batch_size: int      # rows of the global batch

    def keep(self, layer, shape, keep_prob):
        """1.0 for each unit of `shape` (this micro-batch's input to the dropout layer
        `layer`, a tuple of ints naming it in the whole model) that is kept, 0.0 if dropped."""
        rng = np.random.default_rng((self.seed, self.step, *layer))
        uniform = rng.random((self.batch_size, *shape[1:]), dtype=np.float32)
        return ms.Tensor((uniform[self.rows] < keep_prob).astype(np.float32))


def draws(config, batch, step):
    """Each micro-batch's MaskDraw for optimizer step `step`."""
    return [MaskDraw(config.seed, step, rows, config.batch_size) for rows in batch.cut]


class KeepMask(nn.Cell):
    """Dropout: (x, masks) -> (x * mask / keep_prob, (mask,)), with its own mask of `masks`."""
    residual_count = 1

    def __init__(self, dropout, index):
        super().__init__(auto_prefix=False)
        self.index = index
        self.scale = 1.0 / dropout.dropout.keep_prob

    def construct(self, x, masks):
        mask = masks[self.index]
        return x * mask.astype(x.dtype) * self.scale, (mask,)


class MaskGrad(nn.Cell):
    """Dropout's backward from its kept mask: (mask, dy) -> (dy * mask / keep_prob, ())."""

    def __init__(self, dropout):
        super().__init__(auto_prefix=False)
        self.scale = 1.0 / dropout.dropout.keep_prob

    def construct(self, mask, dy):
        return dy * mask.astype(dy.dtype) * self.scale, ()


def is_dropout(layer):
    return type(layer) is nn.Dropout


class Dropout:
    """Chunk feature: each nn.Dropout layer takes its mask from the chunk's `extras`, drawn
    from `draws[mb]` (the engine sets this step's) or, with no draw, keeping every unit.
    Needs `named[k]`, leaf layer k's place in the whole model, which names its masks."""

    draws = ()

    @cached_property
    def mask_shapes(self):
        """Input spec -> each layer's input shape (found once per spec)."""
        return {}

    def keeps(self, i):
        if is_dropout(self.layers[i]):
            return KeepMask(self.layers[i], sum(map(is_dropout, self.layers[:i])))
        return super().keeps(i)

    def layer_grad(self, i, input_grad, make=LayerGrad):
        if is_dropout(self.layers[i]):
            return MaskGrad(self.layers[i])
        return super().layer_grad(i, input_grad, make)

    def extras(self, mb, x):
        spec = spec_of(x)
        if spec not in self.mask_shapes:
            self.mask_shapes[spec] = self._input_shapes(x)
        return self.masks(spec, self.draws[mb] if mb is not None and self.draws else None)

    def masks(self, spec, draw):
        """The dropout layers' keep masks, in layer order, for an input of `spec` that this
        chunk has seen. `draw` None keeps every unit."""
        shapes = self.mask_shapes.get(spec)
        return tuple(ops.ones(shapes[k], ms.float32) if draw is None else
                     draw.keep(self.named[k], shapes[k], layer.dropout.keep_prob)
                     for k, layer in enumerate(self.layers) if is_dropout(layer))

    def _input_shapes(self, x):
        """Every layer's input shape, from one eager pass in eval mode (nothing moves)."""
        if not any(map(is_dropout, self.layers)):
            return None
        shapes = []
        self.set_mode(False)
        for layer in self.layers:
            shapes.append(getattr(x, "shape", None))    # (a tuple: no dropout takes it)
            x = layer(*arguments(x))
        self.set_mode(True)
        return shapes
