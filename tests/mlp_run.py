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


class TokenLoss(nn.Cell):
    """(summed cross-entropy over the targets that are not padding (-1), their count): a
    token-mean loss given to pipe as (sum, count) (pipe.normalized_loss)."""

    def __init__(self):
        super().__init__()
        self.cross_entropy = nn.CrossEntropyLoss(reduction="sum", ignore_index=-1)

    def construct(self, logits, labels):
        return self.cross_entropy(logits, labels), (labels != -1).sum().astype(ms.float32)


class TokenMean(nn.Cell):
    """One process's token mean over the whole batch: total sum / total count."""

    def __init__(self, model):
        super().__init__()
        self.model, self.loss = model, TokenLoss()

    def construct(self, x, labels):
        total, count = self.loss(self.model(x), labels)
        return total / count


def batches(seed, padded=False):
    """Each step's (inputs, labels); `padded`: a label is -1 (padding) with probability
    0.5 in the batch's first half and 0.1 in its second, so micro-batches count different
    numbers of targets."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH, WIDTHS[0])).astype(np.float32)
        y = rng.integers(0, WIDTHS[-1], BATCH).astype(np.int32)
        if padded:
            y[rng.random(BATCH) < np.repeat([0.5, 0.1], BATCH // 2)] = -1
        out.append((x, y))
    return out


def optimizer(name):
    if name == "sgd":
        return lambda params: nn.SGD(params, learning_rate=0.1)
    # Adam divides by sqrt(second moment): a gradient at round-off level becomes a step of
    # about lr. A small lr keeps that within the tests' tolerance.
    return lambda params: nn.Adam(params, learning_rate=0.001)


def plain_run(name, seed, builders=False, padded=False):
    """({whole-model parameter name: value}, every step's loss) of one plain process;
    `padded`: the token mean over labels with padding."""
    model = LayerBuilders(layer_builders(), seed).whole() if builders else build_model(seed)
    names = dict(model.parameters_and_names())
    with_loss = TokenMean(model) if padded else nn.WithLossCell(model, LOSS)
    step = nn.TrainOneStepCell(with_loss, optimizer(name)(model.trainable_params()))
    losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in batches(seed, padded)]
    return {n: p.asnumpy() for n, p in names.items()}, losses


def pipe_run(spec, communicator):
    """Train `spec` ({"config": PipelineConfig fields, "optimizer", "seed", "save",
    "builders": the model as layer builders, "padded": a (sum, count) loss}) on the ranks of `communicator`; saves the
    model after the last step. Returns the engine and this rank's results."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    config = PipelineConfig(batch_size=BATCH, seed=spec["seed"], **spec["config"])
    data = batches(spec["seed"], spec.get("padded", False))
    sample = data[0][0][:BATCH // (config.data_parallel * config.micro_batches)]
    before = model_parameters_held()        # earlier runs in this process may hold theirs
    model = (layer_builders() if spec.get("builders") else
             dropout_model(spec["seed"]) if spec.get("dropout") else build_model(spec["seed"]))
    engine = PipelineEngine(model, TokenLoss() if spec.get("padded") else LOSS,
                            optimizer(spec["optimizer"]), config,
                            DeadlineWire(120.0, communicator), sample=sample)
    held = model_parameters_held() - before
    losses = [engine.train_step(x, y) for x, y in data]
    engine.save(spec["save"], STEPS)
    return engine, {"losses": losses, "parameters_held": held,
                    "update_in_graph": engine.update_in_graph}
