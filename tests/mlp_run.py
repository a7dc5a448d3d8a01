"""The training run behind the transparency tests, written against the library alone.

`pipe_run` drives `PipelineEngine` with a `PipelineConfig` (no example, no flags);
`plain_run` is MindSpore's own `TrainOneStepCell` on the whole batch in one process: what
every layout must train. Both start from the same weights, drawn from numpy (not from
MindSpore's generator), and see the same batches.
"""
import gc

import mindspore as ms
import numpy as np
from mindspore import nn

from pipe.builders import LayerBuilders
from pipe.deadlines import DeadlineWire
from pipe.config import PipelineConfig
from pipe.engine import PipelineEngine

WIDTHS = (20, 32, 32, 32, 10)       # 3 x (Dense + ReLU), then Dense to 10 classes
BATCH, STEPS = 16, 2
LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def build_model(seed):
    rng = np.random.default_rng(seed)
    blocks = [nn.SequentialCell([nn.Dense(a, b), nn.ReLU()]) for a, b in zip(WIDTHS[:-2], WIDTHS[1:-1])]
    model = nn.SequentialCell(blocks + [nn.Dense(WIDTHS[-2], WIDTHS[-1])])
    for p in model.trainable_params():
        p.set_data(ms.Tensor(rng.normal(0.0, 0.3, p.shape).astype(np.float32)))
    return model


def dropout_model(seed):
    """The same MLP with a dropout (p=0.5) after each hidden ReLU."""
    blocks = list(build_model(seed).cells())
    return nn.SequentialCell([nn.SequentialCell([*b.cells(), nn.Dropout(p=0.5)])
                              for b in blocks[:-1]] + [blocks[-1]])


def layer_builders():
    """The same MLP as one builder per layer (pipe.builders): MindSpore's own initial
    weights, drawn per layer from (seed, layer index)."""
    pairs = list(zip(WIDTHS[:-2], WIDTHS[1:-1]))
    return [lambda a=a, b=b: nn.SequentialCell([nn.Dense(a, b), nn.ReLU()]) for a, b in pairs] + \
        [lambda: nn.Dense(WIDTHS[-2], WIDTHS[-1])]


def model_parameters_held():
    """Elements of every model Parameter alive in this process (whole-model names such as
    `2.0.weight`; optimizer state, named `moment1.2.0.weight`, is not counted)."""
    gc.collect()
    return sum(o.size for o in gc.get_objects()      # type(), not isinstance: no weak proxies
               if issubclass(type(o), ms.Parameter) and o.name[:1].isdigit())


def batches(seed):
    rng = np.random.default_rng(seed + 1)
    return [(rng.standard_normal((BATCH, WIDTHS[0])).astype(np.float32),
             rng.integers(0, WIDTHS[-1], BATCH).astype(np.int32)) for _ in range(STEPS)]


def optimizer(name):
    if name == "sgd":
        return lambda params: nn.SGD(params, learning_rate=0.1)
    # Adam divides by sqrt(second moment): a gradient at round-off level becomes a step of
    # about lr. A small lr keeps that within the tests' tolerance.
    return lambda params: nn.Adam(params, learning_rate=0.001)


def plain_run(name, seed, builders=False):
    """({whole-model parameter name: value}, every step's loss) of one plain process."""
    model = LayerBuilders(layer_builders(), seed).whole() if builders else build_model(seed)
    names = dict(model.parameters_and_names())
    step = nn.TrainOneStepCell(nn.WithLossCell(model, LOSS), optimizer(name)(model.trainable_params()))
    losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in batches(seed)]
    return {n: p.asnumpy() for n, p in names.items()}, losses


def pipe_run(spec, communicator):
    """Train `spec` ({"config": PipelineConfig fields, "optimizer", "seed", "save", and
    "builders": the model as layer builders}) on the ranks of `communicator`; saves the
    model after the last step. Returns the engine and this rank's results."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    config = PipelineConfig(batch_size=BATCH, seed=spec["seed"], **spec["config"])
    data = batches(spec["seed"])
    sample = data[0][0][:BATCH // (config.data_parallel * config.micro_batches)]
    before = model_parameters_held()        # earlier runs in this process may hold theirs
    model = (layer_builders() if spec.get("builders") else
             dropout_model(spec["seed"]) if spec.get("dropout") else build_model(spec["seed"]))
    engine = PipelineEngine(model, LOSS, optimizer(spec["optimizer"]), config,
                            DeadlineWire(120.0, communicator), sample=sample)
    held = model_parameters_held() - before
    losses = [engine.train_step(x, y) for x, y in data]
    engine.save(spec["save"], STEPS)
    return engine, {"losses": losses, "parameters_held": held,
                    "update_in_graph": engine.update_in_graph}
