"""The unsplit model of layers that hand tuples on: what one process trains.

As DeepSpeed does, a tuple output is the next layer's positional arguments, and a layer
that is a plain `nn.SequentialCell` is chained piece by piece (`pipe.layers.leaves`): the
model pipe splits and the one a process runs are the same function, with
nn.SequentialCell's names."""
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
