"""Dropout masks drawn on the host from (seed, step, layer, sample): every layout draws the same.

MindSpore draws a dropout mask inside the kernel: it would depend on how the batch was cut
and in which order micro-batches ran, and pipe's backward would draw another. Here a mask
is a function of the seed, the step, the layer's place in the whole model and the row in
the global batch; the forward takes it as an input and keeps it, the backward reuses it."""
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.layers import arguments
from pipe.wire import spec_of

__all__ = ["MaskDraw", "Masks", "draws", "is_dropout", "forward_piece", "backward_piece"]


@dataclass(frozen=True)
class MaskDraw:
    """Where one micro-batch's dropout masks come from."""
    seed: int
    step: int            # the optimizer step, 1 for the first
    rows: slice          # this micro-batch's rows of the global batch
    batch_size: int      # rows of the global batch

    def keep(self, layer, shape, keep_prob):
        """1.0 for each kept unit of `shape` (this micro-batch's input to dropout layer `layer`),
        0.0 for a dropped one."""
        rng = np.random.default_rng((self.seed, self.step, *layer))
        uniform = rng.random((self.batch_size, *shape[1:]), dtype=np.float32)
        return ms.Tensor((uniform[self.rows] < keep_prob).astype(np.float32))


def draws(config, batch, step):
    """Each micro-batch's MaskDraw for optimizer step `step`."""
    return [MaskDraw(config.seed, step, rows, config.batch_size) for rows in batch.cut]


class KeepMask(nn.Cell):
    """Dropout: (x, masks) -> (x * mask / keep_prob, (mask,)), with its own mask of `masks`;
    in eval mode (predict) x as it is."""
    residual_count = 1

    def __init__(self, dropout, index):
        super().__init__(auto_prefix=False)
        self.dropout, self.index = dropout, index
        self.scale = 1.0 / dropout.dropout.keep_prob

    def construct(self, x, masks):
        mask = masks[self.index]
        if not self.dropout.training:
            return x, (mask,)
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


def forward_piece(chunk, i, piece):
    """An nn.Dropout as the forward runs it: its mask taken from the masks given."""
    layers = chunk.layers
    return KeepMask(layers[i], sum(map(is_dropout, layers[:i]))) if is_dropout(layers[i]) else piece


def backward_piece(chunk, i, grad):
    return MaskGrad(chunk.layers[i]) if is_dropout(chunk.layers[i]) else grad


class Masks:
    """A chunk's dropout masks, in layer order, for an input spec it has `learn`ed; `named[k]`
    (leaf layer k's place in the whole model) names them."""

    def __init__(self, layers, named):
        self.layers, self.named = layers, named
        self.dropouts = [(k, layer) for k, layer in enumerate(layers) if is_dropout(layer)]
        self.shapes = {}                 # input spec -> each layer's input shape (None: no dropout)

    def learn(self, x):
        """Every layer's input shape for an input like `x` (one eager pass in eval mode); returns
        the masks that keep every unit."""
        spec = spec_of(x)
        if spec not in self.shapes:
            self.shapes[spec] = self._input_shapes(x) if self.dropouts else None
        return self.of(spec)

    def of(self, spec, draw=None):
        """The masks for an input of `spec`, of `draw` (None: keep every unit), as variables of a
        compiled call (`ms.mutable`), not constants compiled again for each draw."""
        shapes = self.shapes.get(spec)
        masks = tuple(ops.ones(shapes[k], ms.float32) if draw is None else
                      draw.keep(self.named[k], shapes[k], layer.dropout.keep_prob)
                      for k, layer in self.dropouts)
        return ms.mutable(masks) if masks else masks

    def _input_shapes(self, x):
        shapes, modes = [], [layer.training for layer in self.layers]
        for layer in self.layers:
            layer.set_train(False)
        for layer in self.layers:
            shapes.append(getattr(x, "shape", None))    # (a tuple: no dropout takes it)
            x = layer(*arguments(x))
        for layer, training in zip(self.layers, modes):
            layer.set_train(training)
        return shapes
