"""Layers a user may bring that pipe must refuse or report, shared by the in-process tests
and the multi-rank checks (tests/failure_check.py)."""
import mindspore as ms
from launch import load_example
from mindspore import nn, ops

TiedHead = load_example("tied_model", "tied", "model.py").TiedHead   # reuses an embedding


class Attending(nn.Cell):
    """A block that returns (x, attention), into a next layer that takes one tensor."""

    def __init__(self, width):
        super().__init__()
        self.dense = nn.Dense(width, width)

    def construct(self, x):
        return self.dense(x), x


class HiddenDropout(nn.Cell):
    """Randomness in a layer's own construct: no nn.Dropout cell, nothing in its name."""

    def __init__(self, width):
        super().__init__()
        self.dense = nn.Dense(width, width)

    def construct(self, x):
        return ops.dropout(self.dense(x), p=0.5)


class GraphOnly(nn.Cell):
    """Runs eagerly, but cannot compile: a host call inside the graph."""

    def construct(self, x):
        return ms.Tensor(x.asnumpy())


class NoBackward(nn.Cell):
    """A forward that works and a backward that raises."""

    def construct(self, x):
        return x * 2

    def bprop(self, x, out, dout):
        raise ValueError("this layer has no backward")


class Tagging(nn.Cell):
    """Hands on (x, a uint16 tag): a dtype no wire carries."""

    def construct(self, x):
        return x, (x > 0).astype(ms.uint16)


class Untagging(nn.Cell):
    def construct(self, x, tag):
        return x * tag.astype(x.dtype)
