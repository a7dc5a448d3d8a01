"""The backward in two pieces: I, the input gradient the previous stage waits for, and W,
the weight gradients nobody waits for (zero-bubble schedules, deferred W).

I runs each layer's backward for dx only and stashes each weighted layer's output
gradient; W computes dW = dY^T X from it and the kept input. A W deferred to the flush
joins every micro-batch's rows inside its compiled call: one product per layer. A layer
norm's backward gives dx and its weight gradients at once: I keeps those, W sums them."""
import mindspore as ms
from mindspore import nn, ops

from pipe.layers import (Backward, Differentiable, arguments, gradient_positions, has_bool,
                         is_norm, per_weight)

__all__ = ["split_cells", "rows_of"]


class WeightGrad(nn.Cell):
    """W: (per micro-batch, what I left waiting) -> the weight gradients over all their rows."""

    def __init__(self, layers, residual_of):
        super().__init__(auto_prefix=False)
        weighted = [i for i, layer in enumerate(layers) if layer.trainable_params()]
        products = [i for i in weighted if not is_norm(layers[i])]
        self.inputs = tuple(residual_of[i] for i in products)   # the residuals W reads
        self.input_of = tuple(products.index(i) if i in products else -1 for i in weighted)
        self.layers = nn.CellList([layers[i] for i in weighted])
        self.guarded = nn.CellList([Differentiable(layers[i]) for i in weighted])
        self.weights = [ms.ParameterTuple(layers[i].trainable_params()) for i in weighted]
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.positions = gradient_positions(layers)

    def construct(self, *entries):
        tensors = rows_of(entries)       # the inputs W reads, then the stashes
        grads = ()
        for k in range(len(self.layers)):
            stash = tensors[len(self.inputs) + k]
            if self.input_of[k] < 0:             # a norm's, from I: each micro-batch's added up
                for j in range(len(stash)):      # (rows_of joined them on their first axis)
                    grads = grads + (stash[j].reshape((-1,) + self.weights[k][j].shape).sum(0),)
            else:
                x = tensors[self.input_of[k]]
                layer = self.guarded[k] if has_bool(arguments(x)) else self.layers[k]
                grads = grads + self.grad(layer, self.weights[k])(*arguments(x), stash)
        return per_weight(grads, self.positions)


def split_cells(chunk):
    """The chunk's I (a Backward of LayerGrads without weights: dx, and what W needs) and W
    cells."""
    return (Backward(chunk.layer_grads(not chunk.is_first, weights=False)),
            WeightGrad(chunk.layers, chunk.residual_of))


JOIN = ops.HyperMap()


def _join(*parts):
    return ops.cat(parts)


def rows_of(entries):
    """What W reads, the `waiting` entries of its micro-batches joined row-wise, tensor by
    tensor (one HyperMap, which compiles faster than a loop: docs/performance.md; the
    compiler drops each join no product reads)."""
    if len(entries) == 1:
        return entries[0]
    return JOIN(_join, *entries)
