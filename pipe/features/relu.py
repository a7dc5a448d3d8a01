"""ReLU keeps its output, not its input: a Dense + ReLU pair holds one tensor, as in autograd.

ReLU's gradient needs only its output (dy where it is > 0), which is the next layer's kept
input: the ReLU keeps nothing of its own unless it is the chunk's last layer or a dropout
follows. Its backward is autograd's own kernel, ReluGrad at the output (pipe.private)."""
from mindspore import nn

from pipe.features.dropout import is_dropout
from pipe.features.precision import computes_half, norms
from pipe.layers import KeepInput
from pipe.private import relu_grad

__all__ = ["is_relu", "uses_output", "forward_piece", "backward_piece"]


def is_relu(layer):
    """An nn.ReLU itself: a subclass may compute something else."""
    return type(layer) is nn.ReLU


class KeepOutput(KeepInput):
    """ReLU: (x, extras) -> (y, (y,))."""

    def construct(self, x, extras):
        y = self.layer(x)
        return y, (y,)


class SharesOutput(KeepOutput):
    """ReLU before a layer that keeps its input: (x, extras) -> (y, ()); its backward reads
    that layer's residual."""
    residual_count = 0

    def construct(self, x, extras):
        return self.layer(x), ()


class OutputGrad(nn.Cell):
    """ReLU's backward from its output: (y, dy) -> (dy where y > 0, ())."""

    def __init__(self):
        super().__init__(auto_prefix=False)
        self.relu_grad = relu_grad()

    def construct(self, y, dy):
        return self.relu_grad(dy, y), ()


def uses_output(chunk, i):
    """Whether leaf layer i is a ReLU whose backward runs at its output; not in fp16 where its
    input may be float32 (the chunk's input, a batch norm's output)."""
    layers = chunk.layers
    half_input = computes_half(layers[i]) and (i == 0 or bool(norms(layers[i - 1])))
    return is_relu(layers[i]) and not half_input


def forward_piece(chunk, i, piece):
    """An nn.ReLU keeping its output, or nothing when the next layer keeps it as its input."""
    if not uses_output(chunk, i):
        return piece
    layers = chunk.layers
    shares = i + 1 < len(layers) and not is_dropout(layers[i + 1])   # (a layer keeps it)
    return SharesOutput(layers[i]) if shares else KeepOutput(layers[i])


def backward_piece(chunk, i, grad):
    """An nn.ReLU's backward: ReluGrad at its kept output."""
    return OutputGrad() if uses_output(chunk, i) else grad
