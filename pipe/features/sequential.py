"""The unsplit model of layers that hand tuples on: what one process trains.

`nn.SequentialCell` passes each layer's output to the next as one argument. pipe follows
DeepSpeed: a tuple output is the next layer's positional arguments (`(hidden, keep)` into
`construct(self, x, keep)`). `Sequential` chains layers the same way, and as pipe does, a
layer that is a plain `nn.SequentialCell` (a transformer block written as pieces) is
chained piece by piece (`pipe.layers.leaves`), so the model pipe splits and the model
one process runs are the same function. Its cells and their names are nn.SequentialCell's:
checkpoints load into either.
"""
from mindspore import nn

from pipe.layers import arguments, leaves

__all__ = ["Sequential"]


class Sequential(nn.SequentialCell):
    def __init__(self, *args):
        super().__init__(*args)
        # A tuple, not a CellList: the pieces are not registered again, so they keep
        # the names nn.SequentialCell gave them.
        self.pieces = tuple(leaves(list(self.cell_list)))

    def construct(self, x):
        for layer in self.pieces:
            x = layer(*arguments(x))
        return x
