"""A chunk: one virtual stage's layers and the compiled cells the action handlers call:
F (`forward_cell`), B (`backward_cell`), I and W (pipe.split_backward), and F in eval mode.

Layer i's forward keeps its input and its backward differentiates it there, unless one of
`rules` (the features that change what a layer keeps: dropout, ReLU, fp16; each a module
with `forward_piece(chunk, i, piece)` and `backward_piece(chunk, i, grad)`) replaces it."""
import mindspore as ms

from pipe.compiled import Compiled
from pipe.layers import (Backward, Buffers, Forward, KeepInput, KeepsBuffers, LayerGrad,
                         buffers_of, gradient_positions, last_first, leaves, residual_indices,
                         variable)
from pipe.split_backward import split_cells

__all__ = ["Chunk"]


class Chunk:
    """`loss`: the loss term (pipe.features.token_loss.LossTerm) on the model's last chunk,
    else None; `named[k]`, leaf layer k's place in the whole model, names its masks and
    errors; `masks(layers, named)` makes what the forward takes beside x and the labels."""

    def __init__(self, layers, loss, is_first, first_layer, rules, masks):
        self.named = [(first_layer + i, j) for i, layer in enumerate(layers)
                      for j in range(len(leaves([layer])))]
        self.layers = leaves(layers)
        self.params = list({id(p): p for layer in self.layers
                            for p in layer.trainable_params()}.values())
        self.buffers = buffers_of(self.layers)
        self.is_first, self.is_last, self.loss_fn = is_first, loss is not None, loss
        self.rules = tuple(rules)
        pieces = [self.forward_piece(i) for i in range(len(self.layers))]
        self.residual_of = residual_indices(pieces)
        self.forward_cell = Compiled(Forward(pieces, self.loss_fn))
        self.backward_cell = self.backward(Backward(self.layer_grads(not is_first),
                                                    gradient_positions(self.layers)))
        input_grad, weight_grad = split_cells(self)
        self.input_grad_cell, self.weight_grad_cell = map(self.backward, (input_grad, weight_grad))
        self.weight_inputs = weight_grad.inputs        # the residuals W reads
        self.eval_cell = Compiled(Forward(pieces))    # F again, compiled for eval mode only
        self.kept_buffers = Buffers(self.buffers)      # (the check before the first step's)
        self.masks = masks(self.layers, self.named)
        self.no_labels = ms.Tensor(0, ms.int32)        # what a chunk without the loss is given
        self.training = None                           # the mode the layers are in

    def backward(self, cell):
        """A backward piece as one compiled call, putting back any buffer it moved."""
        return Compiled(KeepsBuffers(cell, self.buffers) if self.buffers else cell)

    def forward_piece(self, i):
        """Layer i as the forward runs it: (x, masks) -> (output, what its backward keeps)."""
        piece = KeepInput(self.layers[i])
        for rule in self.rules:
            piece = rule.forward_piece(self, i, piece)
        return piece

    def backward_piece(self, i, input_grad, weights=True):
        """Layer i's backward, (its residual, dy) -> (dx, its weight gradients (B) or what W
        reads (I: no `weights`)): pipe.layers.LayerGrad."""
        grad = LayerGrad(self.layers[i], input_grad, weights)
        for rule in self.rules:
            grad = rule.backward_piece(self, i, grad)
        return grad

    def layer_grads(self, input_grad, weights=True):
        """Every layer's backward, last first, each knowing its residual's index."""
        return last_first([self.backward_piece(i, input_grad or i > 0, weights)
                           for i in range(len(self.layers))], self.residual_of)

    def set_mode(self, training):
        if self.training != training:
            for layer in self.layers:
                layer.set_train(training)
            self.training = training

    state = property(lambda self: self.params + self.buffers)   # what a checkpoint holds of it

    def infer(self, x):
        """F in eval mode (predict): the chunk's output, the model's on the last chunk; what
        it would keep for a backward is dropped."""
        self.set_mode(False)
        return self.eval_cell(variable(x), self.no_labels, 1.0, self.masks.learn(x))[0]
