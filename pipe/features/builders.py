"""A model given as one builder per layer: each rank builds only the layers it runs.

    model = [lambda: nn.SequentialCell([nn.Dense(784, 256), nn.ReLU()]), ...,
             lambda: nn.Dense(256, 10)]

So a model too large for one process can be pipelined (DeepSpeed's LayerSpec). Layer i is
built right after seeding with (config.seed, i): every layout starts from the same weights,
named as in `nn.SequentialCell(built layers)`. A layer using an earlier one's weights (a
head tied to the embedding) is `Tied(owner, builder)` (DeepSpeed's TiedLayerSpec); every
rank builds tied layers and their owners. A builder returning a weight made outside it
would give each rank an unsynchronized copy: refused, as are partitions that weigh every
layer."""
import gc
import weakref
from typing import NamedTuple

import mindspore as ms
import numpy as np
from mindspore import nn

from pipe.layers import Sequential
from pipe.partition import check_layer

__all__ = ["LayerBuilders", "Tied", "layer_seed"]

NOT_NEW = ("a builder makes its layer's weights when called, so build the layer inside it. A "
           "weight shared by two layers (a tied embedding and output head) is given as "
           "pipe.features.builders.Tied(owner, builder): builder(the owner layer) uses its weights")


class Tied(NamedTuple):
    """The builder of a layer that uses weights of the earlier layer `owner`:
    `builder(owner layer)` returns it."""
    owner: int
    builder: object


def layer_seed(seed, index):
    """The MindSpore seed layer `index` is built under."""
    return int(np.random.SeedSequence((seed, index)).generate_state(1)[0] % 2**31)


class LayerBuilders:
    """The layers of a model, each built the first time it is asked for."""

    def __init__(self, builders, seed):
        if not builders or not all(isinstance(b, Tied) or callable(b) and not isinstance(b, nn.Cell)
                                   for b in builders):
            raise TypeError("a model given as a list is one builder per layer, a function "
                            "returning an nn.Cell; layers already built go in an nn.SequentialCell")
        self.builders, self.seed, self.built = list(builders), seed, {}
        self.existing = _parameters_alive()   # a built layer may hold none of these
        for i, b in enumerate(self.builders):
            if isinstance(b, Tied) and not (isinstance(b.owner, int) and 0 <= b.owner < i):
                raise ValueError(f"layer builder {i} is Tied to layer {b.owner!r}, which is not "
                                 f"an earlier layer: give the index of a layer before {i}")
        self.tied = [i for i, b in enumerate(self.builders) if isinstance(b, Tied)]

    def __len__(self):
        return len(self.builders)

    def __getitem__(self, i):
        if i not in self.built:
            build = self.builders[i]
            owner = self[build.owner] if isinstance(build, Tied) else None
            ms.set_seed(layer_seed(self.seed, i))
            layer = build.builder(owner) if owner is not None else build()
            if not isinstance(layer, nn.Cell):
                raise TypeError(f"layer builder {i} returned a {type(layer).__name__}, not an "
                                "nn.Cell: each builder returns one layer")
            check_layer(i, layer)
            self._check_new(i, layer, owner)
            self.built[i] = layer
        return self.built[i]

    def build_tied(self):
        """Build every tied layer and its owner, on every rank (see the module's doc)."""
        for i in self.tied:
            self[i]

    def held(self, first, last):
        """The layers built in [first, last)."""
        return [self.built[i] for i in range(first, last) if i in self.built]

    def _check_new(self, i, layer, owner):
        """Refuse a layer holding a weight made outside its builder (other than its
        owner's), or one another built layer holds."""
        shared = {id(p) for p in owner.get_parameters()} if owner is not None else set()
        others = {id(p) for built in self.built.values() for p in built.get_parameters()}
        for p in layer.get_parameters():
            before = id(p) in self.existing and self.existing[id(p)]() is p
            if id(p) not in shared and (before or id(p) in others):
                held = "was made before the builders ran" if before else \
                    "another built layer holds too"
                raise TypeError(f"layer builder {i} returned a layer with parameter {p.name!r}, "
                                f"which {held}: {NOT_NEW}")

    def name_cells(self):
        """The built layers by index, as an nn.SequentialCell names its layers."""
        return {str(i): self.built[i] for i in sorted(self.built)}

    def whole(self):
        """Every layer built, as the model one process would train (pipe.layers.Sequential)."""
        return Sequential([self[i] for i in range(len(self))])


def _parameters_alive():
    """{id: weak reference} of every MindSpore Parameter alive in this process now."""
    return {id(o): weakref.ref(o) for o in gc.get_objects()
            if issubclass(type(o), ms.Parameter)}   # type(): no weak proxies
