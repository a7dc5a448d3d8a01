"""A model given as one builder per layer: each rank builds only the layers it runs.

    model = [lambda: nn.SequentialCell([nn.Dense(784, 256), nn.ReLU()]), ...,
             lambda: nn.Dense(256, 10)]
    engine = PipelineEngine(model, loss_fn, make_optimizer, config)

A model that does not fit in one process can then still be pipelined (DeepSpeed's
LayerSpec, torch's meta-device construction). Layer i is built right after seeding
MindSpore with (config.seed, i), so its initial weights do not depend on which other
layers a process builds: every layout, and one process building them all, start from the
same model. Its parameters are named as in `nn.SequentialCell(built layers)` (`3.weight`).

What needs every layer is refused with the fix: partition="parameters" or "time" (they
weigh every layer), and tied weights (a builder cannot return a layer another rank built).
"""
import mindspore as ms
import numpy as np
from mindspore import nn

from pipe.chunk import leaves
from pipe.partition import check_layer

__all__ = ["LayerBuilders", "layer_seed"]


def layer_seed(seed, index):
    """The MindSpore seed layer `index` is built under."""
    return int(np.random.SeedSequence((seed, index)).generate_state(1)[0] % 2**31)


class LayerBuilders:
    """The layers of a model, each built the first time it is asked for."""

    def __init__(self, builders, seed):
        if not builders or not all(callable(b) and not isinstance(b, nn.Cell) for b in builders):
            raise TypeError("a model given as a list is one builder per layer, a function "
                            "returning an nn.Cell; layers already built go in an nn.SequentialCell")
        self.builders, self.seed, self.built = list(builders), seed, {}

    def __len__(self):
        return len(self.builders)

    def __getitem__(self, i):
        if i not in self.built:
            ms.set_seed(layer_seed(self.seed, i))
            layer = self.builders[i]()
            if not isinstance(layer, nn.Cell):
                raise TypeError(f"layer builder {i} returned a {type(layer).__name__}, not an "
                                "nn.Cell: each builder returns one layer")
            for leaf in leaves([layer]):
                check_layer(i, leaf)
            self.built[i] = layer
        return self.built[i]

    def parameters_and_names(self):
        """The built layers' parameters and buffers, named as in the whole model."""
        for i in sorted(self.built):
            for name, p in self.built[i].parameters_and_names():
                yield f"{i}.{name}", p

    def whole(self):
        """Every layer built, as the nn.SequentialCell one process would train."""
        return nn.SequentialCell([self[i] for i in range(len(self))])

