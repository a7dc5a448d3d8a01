"""The training run behind the transparency tests, written against the library alone.

`pipe_run` drives `PipelineEngine` with a `PipelineConfig` (no example, no flags);
`plain_run` is MindSpore's own `TrainOneStepCell` on the whole batch in one process: what
every layout must train. Both start from the same weights, drawn from numpy (not from
MindSpore's generator), and see the same batches.
"""
import gc

import mindspore as ms
import numpy as np
from launch import loop_config
from mindspore import nn

from pipe.engine import PipelineEngine
from pipe.features.builders import LayerBuilders
from pipe.ops.deadlines import DeadlineWire
from pipe.wire import elements

WIDTHS = (20, 32, 32, 32, 10)       # 3 x (Dense + ReLU), then Dense to 10 classes
BATCH, STEPS = 16, 2
FP16_STEPS, OVERFLOW = 4, 13.0      # float16 runs: steps, and an input whose batch's dW overflows
LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def build_model(seed, frozen=False):
    """The MLP, its weights drawn from `seed`; `frozen`: its first layer is not trained."""
    rng = np.random.default_rng(seed)
    blocks = [nn.SequentialCell([nn.Dense(a, b), nn.ReLU()]) for a, b in zip(WIDTHS[:-2], WIDTHS[1:-1])]
    model = nn.SequentialCell(blocks + [nn.Dense(WIDTHS[-2], WIDTHS[-1])])
    for p in model.trainable_params():
        p.set_data(ms.Tensor(rng.normal(0.0, 0.3, p.shape).astype(np.float32)))
    for p in model[0][0].get_parameters() if frozen else ():
        p.requires_grad = False
    return model


def dropout_model(seed):
    """The same MLP with a dropout (p=0.5) after each hidden ReLU."""
    blocks = list(build_model(seed).cells())
    return nn.SequentialCell([nn.SequentialCell([*b.cells(), nn.Dropout(p=0.5)])
                              for b in blocks[:-1]] + [blocks[-1]])


def flat_model(seed):
    """The same MLP as 7 layers, each Dense and each ReLU its own: a ReLU can be a stage."""
    return nn.SequentialCell([layer for block in build_model(seed).cells()
                              for layer in (block.cells() if len(block.cells()) else [block])])


def layer_builders(batch_norm=False):
    """The same MLP as one builder per layer (pipe.features.builders): MindSpore's own initial
    weights, drawn per layer from (seed, layer index); `batch_norm`: the first layer
    normalizes its output (buffers on the first stage only)."""
    pairs = list(zip(WIDTHS[:-2], WIDTHS[1:-1]))
    builders = [lambda a=a, b=b: nn.SequentialCell([nn.Dense(a, b), nn.ReLU()]) for a, b in pairs]
    if batch_norm:
        builders[0] = lambda: nn.SequentialCell([nn.Dense(WIDTHS[0], WIDTHS[1]),
                                                 nn.BatchNorm1d(WIDTHS[1]), nn.ReLU()])
    return builders + [lambda: nn.Dense(WIDTHS[-2], WIDTHS[-1])]


def model_parameters_held():
    """Elements of every model Parameter alive in this process (whole-model names such as
    `2.0.weight`; optimizer state, named `moment1.2.0.weight`, is not counted)."""
    gc.collect()
    return sum(o.size for o in gc.get_objects()      # type(), not isinstance: no weak proxies
               if issubclass(type(o), ms.Parameter) and o.name[:1].isdigit())


class TokenLoss(nn.Cell):
    """(summed cross-entropy over the targets that are not padding (-1), their count): a
    token-mean loss given to pipe as (sum, count) (pipe.features.token_loss)."""

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


def batches(seed, padded=False, steps=STEPS, overflow=None):
    """Each step's (inputs, labels); `padded`: a label is -1 (padding) with probability
    0.5 in the batch's first half and 0.1 in its second, so micro-batches count different
    numbers of targets. `overflow`: at that step (0-based) every even sample is the first
    one, its first input OVERFLOW: at S = 2**14 the first layer's scaled weight gradient
    over the whole batch is about 9.3e4, beyond float16's range (one process's float16
    product is inf), while over either half of the rows it is 4.7e4 and over a quarter
    2.4e4: each micro-batch's sum fits, and each replica's at D = 2."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for step in range(steps):
        x = rng.standard_normal((BATCH, WIDTHS[0])).astype(np.float32)
        y = rng.integers(0, WIDTHS[-1], BATCH).astype(np.int32)
        if padded:
            y[rng.random(BATCH) < np.repeat([0.5, 0.1], BATCH // 2)] = -1
        if step == overflow:
            x[0::2], y[0::2] = x[0], y[0]
            x[0::2, 0] = OVERFLOW
        out.append((x, y))
    return out


def optimizer(name):
    if name == "sgd":
        return lambda params: nn.SGD(params, learning_rate=0.1)
    # Adam divides by sqrt(second moment): a gradient at round-off level becomes a step of
    # about lr. A small lr keeps that within the tests' tolerance.
    return lambda params: nn.Adam(params, learning_rate=0.001)


def plain_run(name, seed, builders=False, padded=False, frozen=False):
    """({whole-model parameter name: value}, every step's loss) of one plain process;
    `padded`: the token mean over labels with padding; `frozen`: the first layer untrained."""
    model = LayerBuilders(layer_builders(), seed).whole() if builders else build_model(seed, frozen)
    names = dict(model.parameters_and_names())
    with_loss = TokenMean(model) if padded else nn.WithLossCell(model, LOSS)
    step = nn.TrainOneStepCell(with_loss, optimizer(name)(model.trainable_params()))
    losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in batches(seed, padded)]
    return {n: p.asnumpy() for n, p in names.items()}, losses


def plain_fp16_run(seed, loss_scale, overflow=None):
    """({name: value}, every step's loss, the loss scale after every step) of one plain
    process training the MLP in float16 as pipe's precision='fp16' does: every layer
    computes in float16 (MindSpore's `to_float`) on float32 weights, the loss on float32
    logits, its gradient x S, then / S; an inf or nan skips the step, and MindSpore's own
    DynamicLossScaleUpdateCell moves S."""
    model = build_model(seed)
    for layer in model.cells():
        layer.to_float(ms.float16)
    names = dict(model.parameters_and_names())
    weights = model.trainable_params()
    scaled = ms.value_and_grad(lambda x, y, s: LOSS(model(x).astype(ms.float32), y) * s,
                               None, weights)
    losses, scales = fp16_steps(scaled, optimizer("sgd")(weights), loss_scale,
                                batches(seed, steps=FP16_STEPS, overflow=overflow))
    return {n: p.asnumpy() for n, p in names.items()}, losses, scales


def fp16_steps(scaled, optimizer, loss_scale, data):
    """One process's mixed-precision steps: `scaled(x, y, S)` gives (loss x S, gradients
    x S); the gradients / S; an inf or nan skips the step, and MindSpore's own
    DynamicLossScaleUpdateCell moves S. Returns every step's loss and S after it."""
    scale = ms.Parameter(ms.Tensor(loss_scale, ms.float32), name="scale")
    update = nn.DynamicLossScaleUpdateCell(loss_scale, scale_factor=2, scale_window=2000)
    losses, scales = [], []
    for x, y in data:
        s = scale.value().copy()
        loss, grads = scaled(ms.Tensor(x), ms.Tensor(y), s)
        grads = tuple(g / s for g in grads)
        overflowed = not all(bool(ms.ops.isfinite(g).all()) for g in grads)
        update(scale, ms.Tensor(overflowed))
        if not overflowed:
            optimizer(grads)
        losses.append(float((loss / s).asnumpy()))
        scales.append(float(scale.value().asnumpy()))
    return losses, scales


def pipe_run(spec, communicator):
    """Train `spec` ({"config": PipelineConfig fields, "optimizer", "seed", "save",
    "builders": the model as layer builders, "batch_norm": its first with batch norm,
    "padded": a (sum, count) loss, "count_held": count the model parameters this rank
    holds, "flat": the blocks' layers one by one, "frozen": the first layer untrained,
    "replica_seeds": each replica builds the model from seed + its index}) on the ranks of
    `communicator`; saves the model after the last step. Returns the engine and this rank's
    results."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    config = loop_config(batch_size=BATCH, seed=spec["seed"], **spec["config"])
    half = config.precision == "fp16"
    data = batches(spec["seed"], spec.get("padded", False), FP16_STEPS if half else STEPS,
                   spec.get("overflow"))
    sample = data[0][0][:BATCH // (config.data_parallel * config.micro_batches)]
    count = spec.get("count_held", False)   # (two full garbage collections: asked for)
    before = model_parameters_held() if count else 0    # earlier runs here may hold theirs
    replica = communicator.Get_rank() // config.stages if spec.get("replica_seeds") else 0
    model = (layer_builders(spec.get("batch_norm", False)) if spec.get("builders") else
             dropout_model(spec["seed"]) if spec.get("dropout") else
             flat_model(spec["seed"]) if spec.get("flat") else
             build_model(spec["seed"] + replica, spec.get("frozen", False)))
    engine = PipelineEngine(model, TokenLoss() if spec.get("padded") else LOSS,
                            optimizer(spec["optimizer"]), config,
                            DeadlineWire(120.0, communicator), sample=sample)
    held = model_parameters_held() - before if count else None
    losses, scales, summed = [], [], set()
    update_weights = engine.update_weights

    def recorded(grads):                 # the step's weight gradient sums, as summed
        summed.update(str(g.dtype) for g in grads)
        return update_weights(grads)
    engine.update_weights = recorded
    for x, y in data:
        losses.append(engine.train_step(x, y))
        scales.append(engine.scaler.value if half else None)
    engine.save(spec["save"], len(data))
    ((p2p, _, _),) = engine.built.values()                  # (one batch shape)
    wire = sorted({str(dtype) for vs, spec in p2p.specs.items()   # between the stages
                   if 0 < vs < engine.schedule.virtual_stages for _, dtype in elements(spec)})
    return engine, {"losses": losses, "parameters_held": held, "loss_scales": scales,
                    "wire_dtypes": wire,
                    "defer_wgrad": engine.modes.defer_wgrad, "one_graph": engine.modes.one_graph,
                    "grad_dtypes": sorted(summed)}
