"""A model whose layers hand on a tuple of every dtype a layer may hand on, trained by pipe
and by one process (tests/test_boundary_dtypes.py).

    x -> Dense -> Fan -> (h float32, h float16, h > 0 as bool, int32, int64, uint8)
      -> Mix (every element used, all handed on again) -> Head -> logits

The float elements carry gradients back (the float16 one in float16); the bool and integer
ones carry none. Four layers: 1F1B on 2 stages cuts between Fan and Mix, ZB-V's V puts a
layer on each virtual stage, so the tuple crosses a rank boundary and a chunk boundary.
"""
import mindspore as ms
import numpy as np
from launch import loop_config
from mindspore import nn, ops

from pipe.engine import PipelineEngine
from pipe.layers import Sequential
from pipe.ops.deadlines import DeadlineWire
from pipe.wire import elements

BATCH, STEPS, WIDTH = 8, 2, 8
LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
DTYPES = ["Float32", "Float16", "Bool", "Int32", "Int64", "UInt8"]


def floats(b, i32, i64, u8):
    """The non-float elements as one float32 term (each must arrive intact)."""
    return b.astype(ms.float32) + 0.5 * i32.astype(ms.float32) - 0.25 * i64.astype(ms.float32) \
        + 0.125 * u8.astype(ms.float32)


class Guarded(nn.Cell):
    """A layer whose non-float outputs carry no gradient (ops.stop_gradient): MindSpore's
    autograd over the whole model, in one process, cannot add up a bool's uses (it has no
    bool Add). pipe differentiates each layer with no gradient for its non-float values
    (pipe.layers.Differentiable), so there the layers need no guard."""

    def __init__(self, layer):
        super().__init__(auto_prefix=False)
        self.layer = layer

    def construct(self, *args):
        out = ()
        for y in self.layer(*args):
            out = out + ((y if y.dtype in (ms.float32, ms.float16) else ops.stop_gradient(y)),)
        return out


class Fan(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(WIDTH, WIDTH)

    def construct(self, x):
        h = self.dense(x)
        on = h > 0
        return h, h.astype(ms.float16), on, on.astype(ms.int32), on.astype(ms.int64), on.astype(ms.uint8)


class Mix(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(WIDTH, WIDTH)

    def construct(self, h, h16, b, i32, i64, u8):
        h = self.dense(h + h16.astype(ms.float32)) * floats(b, i32, i64, u8)
        return h, h.astype(ms.float16), b, i32, i64, u8


class Head(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(WIDTH, 3)

    def construct(self, h, h16, b, i32, i64, u8):
        return self.dense(h * h16.astype(ms.float32) + floats(b, i32, i64, u8))


def build_model(seed, guarded=False):
    """The model (pipe.layers.Sequential: a tuple is the next layer's arguments), for
    pipe to split, or `guarded`, for one process to differentiate whole."""
    ms.set_seed(seed)
    layers = [nn.Dense(4, WIDTH), Fan(), Mix(), Head()]
    return Sequential(layers[:1] + [Guarded(layer) for layer in layers[1:3]] + layers[3:]
                      if guarded else layers)


def batches(seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, 4)).astype(np.float32), rng.integers(0, 3, BATCH).astype(np.int32))
            for _ in range(STEPS)]


def plain_run(seed):
    """({name: value}, losses) of MindSpore's TrainOneStepCell on the unsplit model."""
    model = build_model(seed, guarded=True)
    names = [p.name for p in build_model(seed).trainable_params()]     # (unwrapped names)
    step = nn.TrainOneStepCell(nn.WithLossCell(model, LOSS), nn.SGD(model.trainable_params(), 0.5))
    losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in batches(seed)]
    return {n: p.asnumpy() for n, p in zip(names, model.trainable_params())}, losses


def pipe_run(spec, communicator):
    """Train `spec` ({"config", "seed", "save"}) on the ranks of `communicator`."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    engine = PipelineEngine(build_model(spec["seed"]), LOSS, lambda ps: nn.SGD(ps, 0.5),
                            loop_config(batch_size=BATCH, **spec["config"]),
                            DeadlineWire(120.0, communicator))
    losses = [engine.train_step(x, y) for x, y in batches(spec["seed"])]
    engine.save(spec["save"], STEPS)
    ((p2p, _, _),) = engine.built.values()                  # (one batch shape)
    crossing = sorted({str(dtype) for vs, spec in p2p.specs.items() if vs > 0 and spec
                       for _, dtype in elements(spec)})      # what reached this rank's stages
    return engine, {"losses": losses, "crossing": crossing}
