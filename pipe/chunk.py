"""A chunk: one virtual stage's layers and the compiled cells the action handlers call.

A chunk holds no step's state (pipe.actions keeps what is in flight): it is its layers,
their parameters and buffers, and its cells, built from pipe.layers and each called as one
compiled graph (pipe.compiled): F (`forward_cell`), B (`backward_cell`), I and W
(`input_grad_cell`, `weight_grad_cell`: pipe.split_backward) and inference (`infer_cell`).
Which piece runs layer i is chosen in one place, `forward_piece` and `backward_piece`: a
list of guards, one per feature that changes what a layer keeps (precision, dropout, ReLU).
"""
import mindspore as ms

from pipe.compiled import Compiled
from pipe.features import dropout, relu
from pipe.features.batchnorm import Buffers, buffers_of
from pipe.features.dropout import Masks, is_dropout
from pipe.features.precision import (GradAsFloat16, LogitsAsFloat32, float16_gradients,
                                     keeps_float32_input, to_half)
from pipe.features.relu import is_relu
from pipe.features.token_loss import LossTerm
from pipe.layers import (Backward, Forward, KeepInput, LayerGrad, arguments, gradient_positions,
                         last_first, leaves, residual_indices)
from pipe.ops.predict import Infer
from pipe.split_backward import split_cells

__all__ = ["Chunk"]


class Chunk:
    """`first_layer` is the chunk's place in the whole model: `named[k]`, (layer of the
    model, leaf within it) of leaf layer k, names its dropout masks and its errors.
    `half`: its layers compute in float16 (pipe.features.precision)."""

    def __init__(self, layers, loss_fn=None, is_first=True, first_layer=0, half=False):
        self.named = [(first_layer + i, j) for i, layer in enumerate(layers)
                      for j in range(len(leaves([layer])))]
        self.layers = leaves(layers)
        self.params = list({id(p): p for layer in self.layers
                            for p in layer.trainable_params()}.values())
        self.buffers = buffers_of(self.layers)
        self.is_first, self.is_last, self.half = is_first, loss_fn is not None, half
        self.loss_fn = None if loss_fn is None else LossTerm(loss_fn)
        pieces = [self.forward_piece(i) for i in range(len(self.layers))]
        self.residual_of = residual_indices(pieces)
        self.forward_cell = Compiled(Forward(pieces, self.loss_fn))
        self.backward_cell = Compiled(Backward(self.layer_grads(not is_first),
                                               gradient_positions(self.layers)))
        input_grad, weight_grad = split_cells(self)
        self.input_grad_cell, self.weight_grad_cell = Compiled(input_grad), Compiled(weight_grad)
        self.weight_inputs = weight_grad.inputs        # the residuals W reads
        self.infer_cell = Compiled(Infer(self.layers))
        self.kept_buffers = Buffers(self.buffers)      # saved and put back around a backward
        self.masks = Masks(self.layers, self.named)    # dropout's, per input spec
        self.no_labels = ms.Tensor(0, ms.int32)        # what a chunk without the loss is given
        self.training = None                           # the mode the layers are in
        self.float16_grads = float16_gradients(self.layers, self.params) if half else ()
        if half:
            to_half(self.layers)

    def is_logits_layer(self, i):
        return self.half and self.is_last and i == len(self.layers) - 1

    def forward_piece(self, i):
        """Layer i as the forward runs it: (x, masks) -> (output, what its backward keeps)."""
        layer = self.layers[i]
        if self.half and keeps_float32_input(self.layers, i):
            piece = KeepInput(layer)
        elif is_dropout(layer):
            piece = dropout.forward_piece(self.layers, i)
        elif is_relu(layer):
            piece = relu.forward_piece(self.layers, i)
        else:
            piece = KeepInput(layer)
        return LogitsAsFloat32(piece) if self.is_logits_layer(i) else piece

    def backward_piece(self, i, input_grad, make=LayerGrad):
        """Layer i's backward: (its residual, dy) -> (dx, weight grads); `make` differentiates
        a layer at its kept input (LayerGrad for B, LayerInputGrad for I)."""
        layer = self.layers[i]
        if self.half and keeps_float32_input(self.layers, i):
            grad = make(layer, input_grad)
        elif is_dropout(layer):
            grad = dropout.backward_piece(layer)
        elif is_relu(layer):
            grad = relu.backward_piece()
        else:
            grad = make(layer, input_grad)
        return GradAsFloat16(grad) if self.is_logits_layer(i) else grad

    def layer_grads(self, input_grad, make=LayerGrad):
        """Every layer's backward, last first, each knowing its residual's index."""
        return last_first([self.backward_piece(i, input_grad or i > 0, make)
                           for i in range(len(self.layers))], self.residual_of)

    def set_mode(self, training):
        if self.training != training:
            for layer in self.layers:
                layer.set_train(training)
            self.training = training

    def labels(self, labels):
        return self.no_labels if labels is None else labels

    @property
    def state(self):
        """What a checkpoint holds of this chunk: parameters, then buffers."""
        return self.params + self.buffers

    def infer(self, x):
        """Forward only, in eval mode, keeping nothing: the model's output on the last chunk."""
        self.set_mode(False)
        return self.infer_cell(*arguments(x))
