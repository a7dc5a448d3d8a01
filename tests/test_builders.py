"""pipe.features.builders: a model given as one builder per layer (in process, no MPI). Layouts
training it like one process, and building only their own layers: tests/test_transparency.py."""
import mindspore as ms
import numpy as np
import pytest
from launch import loop_config
from mindspore import nn
from mlp_run import LOSS, layer_builders
from user_layers import TiedHead

from pipe.engine import PipelineEngine
from pipe.features.builders import LayerBuilders, Tied
from pipe.partition import whole_model_names

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")


def test_a_layer_is_the_same_whichever_other_layers_were_built():
    alone = LayerBuilders(layer_builders(), seed=3)[2]
    whole = LayerBuilders(layer_builders(), seed=3).whole()
    np.testing.assert_array_equal(alone[0].weight.asnumpy(), whole[2][0].weight.asnumpy())
    other_seed = LayerBuilders(layer_builders(), seed=4)[2]
    assert not np.array_equal(alone[0].weight.asnumpy(), other_seed[0].weight.asnumpy())


def test_only_asked_layers_are_built_and_named_as_in_the_whole_model():
    model = LayerBuilders(layer_builders(), seed=0)
    model[1], model[3]
    assert sorted(model.built) == [1, 3]
    assert list(whole_model_names(model).values()) == [
        "1.0.weight", "1.0.bias", "3.weight", "3.bias"]


def engine(model, **config):
    return PipelineEngine(model, LOSS, lambda ps: nn.SGD(ps, learning_rate=0.1),
                          loop_config(batch_size=4, **config))


EMBEDDING = nn.Embedding(32, 4)     # made outside the builders, then captured by two of them


BUILT_ELSEWHERE = ("a builder makes its layer's weights when called, so build the layer inside "
                   "it. A weight shared by two layers (a tied embedding and output head) is given "
                   "as pipe.features.builders.Tied(owner, builder): builder(the owner layer) uses its weights")


@pytest.mark.parametrize("model,config,error,message", [
    ([lambda: EMBEDDING, lambda: nn.Dense(4, 4), lambda: TiedHead(EMBEDDING)], {},
     TypeError, "layer builder 0 returned a layer with parameter 'embedding_table', which was "
                f"made before the builders ran: {BUILT_ELSEWHERE}"),
    ([lambda: nn.Dense(4, 4), lambda: TiedHead(EMBEDDING)], {}, TypeError,
     "layer builder 1 returned a layer with parameter 'embedding_table', which was made before "
     f"the builders ran: {BUILT_ELSEWHERE}"),
    (layer_builders(), {"partition": "parameters"}, ValueError,
     "partition='parameters' weighs every layer, which a model given as layer builders does "
     "not build on every rank; use partition='uniform' or explicit layer counts per stage"),
    ([lambda: nn.Dense(4, 4), Tied(1, TiedHead)], {}, ValueError,
     "layer builder 1 is Tied to layer 1, which is not an earlier layer: give the index of a "
     "layer before 1"),
    ([lambda: nn.Dense(4, 4), lambda: "dense"], {}, TypeError,
     "layer builder 1 returned a str, not an nn.Cell: each builder returns one layer"),
    ([nn.Dense(4, 4)], {}, TypeError,
     "a model given as a list is one builder per layer, a function returning an nn.Cell; "
     "layers already built go in an nn.SequentialCell"),
])
def test_what_builders_cannot_do_is_refused_with_the_fix(model, config, error, message):
    with pytest.raises(error) as err:
        engine(model, **config)
    assert str(err.value) == message
