"""The GPT example's model (examples/gpt) trained by pipe and by one process.

Between its stages travels a tuple (hidden states and an int32 padding mask, which has no
gradient); the batches come in two sequence lengths (16, 8, then 16 again); the loss is
(sum, count) over the real targets, which differ in number between micro-batches; the head
uses the input embedding's table (under ZB-V, two chunks of one rank hold it). `plain_run`
is MindSpore's own TrainOneStepCell over the unsplit model (pipe.layers.Sequential) and the
batch's token mean.
"""
import mindspore as ms
import numpy as np
from launch import load_example, loop_config
from mindspore import nn
from mlp_run import fp16_steps

from pipe.engine import PipelineEngine
from pipe.features.builders import LayerBuilders
from pipe.ops.deadlines import DeadlineWire

gpt = load_example("gpt_model", "gpt", "model.py")

SIZE = dict(layers=2, width=16, heads=2, context=16)
BATCH, LENGTHS = 8, (16, 8, 16)       # the third step has the first's shapes again
ONE_LENGTH = (16, 16)                  # (each new length compiles every cell again: where a
                                       # run is about something else, one length, 2 steps)


def batches(seed, lengths=LENGTHS):
    """Each step's (ids, targets), padded to `lengths`: pieces of the text cut to random
    lengths."""
    rng = np.random.default_rng(seed)
    pieces = [p for p in gpt.paragraphs(max(lengths)) if len(p) == max(lengths) + 1]
    out = []
    for n in lengths:
        chosen = rng.choice(len(pieces), BATCH, replace=False)
        out.append(gpt.pad([pieces[i][:rng.integers(3, n + 2)] for i in chosen], n))
    return out


class TokenMean(nn.Cell):
    """One process's loss: the whole batch's summed token loss over its count."""

    def __init__(self, model):
        super().__init__()
        self.model, self.loss = model, gpt.TokenLoss()

    def construct(self, ids, targets):
        total, count = self.loss(self.model(ids), targets)
        return total / count


def optimizer(params):
    return nn.SGD(params, learning_rate=0.5)


def plain_run(seed, lengths=LENGTHS, size=SIZE):
    """({whole-model parameter name: value}, every step's loss) of one plain process."""
    model = LayerBuilders(gpt.gpt_layers(**size), seed).whole()
    names = [p.name for p in model.trainable_params()]     # (before a wrapper renames them)
    step = nn.TrainOneStepCell(TokenMean(model), optimizer(model.trainable_params()))
    losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in batches(seed, lengths)]
    return {n: p.asnumpy() for n, p in zip(names, model.trainable_params())}, losses


def plain_fp16_run(seed, loss_scale, lengths=LENGTHS, size=SIZE):
    """({name: value}, every step's loss, the loss scale after every step) of one plain
    process running the mixed-precision recipe: every layer computes in float16
    (`to_float`) on float32 weights, float32 logits, (sum / count) x S differentiated
    (mlp_run.fp16_steps)."""
    model = LayerBuilders(gpt.gpt_layers(**size), seed).whole()
    names = [p.name for p in model.trainable_params()]
    for layer in model.cells():
        layer.to_float(ms.float16)
    loss = gpt.TokenLoss()

    def scaled_mean(ids, targets, s):
        total, count = loss(model(ids).astype(ms.float32), targets)
        return total / count * s
    weights = model.trainable_params()
    losses, scales = fp16_steps(ms.value_and_grad(scaled_mean, None, weights), optimizer(weights),
                                loss_scale, batches(seed, lengths))
    return {n: p.asnumpy() for n, p in zip(names, weights)}, losses, scales


class CountingEngine(PipelineEngine):
    """PipelineEngine, counting how often the stages agree on shapes."""
    agreed = 0

    def agree_shapes(self, batch, training=True):
        self.agreed += 1
        return super().agree_shapes(batch, training)


def pipe_run(spec, communicator):
    """Train `spec` ({"config": PipelineConfig fields, "seed", "save"; "lengths" and
    "layers" if not LENGTHS and SIZE's) on the ranks of `communicator`; saves the model
    after the last step. Returns the engine and this rank's results: the losses, and how
    many shapes the stages agreed on."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    config = loop_config(batch_size=BATCH, seed=spec["seed"], **spec["config"])
    size = dict(SIZE, layers=spec.get("layers", SIZE["layers"]))
    engine = CountingEngine(gpt.gpt_layers(**size), gpt.TokenLoss(), optimizer,
                            config, DeadlineWire(120.0, communicator))
    losses, scales = [], []
    lengths = spec.get("lengths", LENGTHS)
    for x, y in batches(spec["seed"], lengths):
        losses.append(engine.train_step(x, y))
        scales.append(engine.scaler.value if engine.scaler else None)
    engine.save(spec["save"], len(lengths))
    return engine, {"losses": losses, "agreed": engine.agreed, "loss_scales": scales}


def example_run(spec, communicator):
    """examples/gpt/train.py with `spec["argv"]`, on the ranks of `communicator`."""
    example = load_example("gpt_train", "gpt", "train.py")
    return example.train(example.parse_args(spec["argv"]), DeadlineWire(120.0, communicator)), {}
