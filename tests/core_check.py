"""pipe.core alone trains what one process trains: GPipe and 1F1B at 2x1, 3x1 and 2x2.

Imports nothing from pipe outside pipe.core. `pipe_run` trains one configuration on the
ranks of a communicator (in the suite's one launch: tests/mpi_worker.py) and returns its
stage's parameters and every step's loss; tests/test_core.py compares them with
`one_process`, MindSpore's TrainOneStepCell on the whole batch.
"""
import mindspore as ms
import numpy as np
from mindspore import nn

from pipe.core.config import Config
from pipe.core.engine import Engine
from pipe.core.wire import MpiWire

WIDTHS, BATCH, STEPS = (12, 16, 16, 16, 10), 8, 3
LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def model():
    rng = np.random.default_rng(0)
    cells = [nn.SequentialCell([nn.Dense(a, b), nn.ReLU()]) for a, b in zip(WIDTHS[:-2], WIDTHS[1:-1])]
    net = nn.SequentialCell(cells + [nn.Dense(WIDTHS[-2], WIDTHS[-1])])
    for p in net.trainable_params():
        p.set_data(ms.Tensor(rng.normal(0.0, 0.3, p.shape).astype(np.float32)))
    return net


def batches():
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((BATCH, WIDTHS[0])).astype(np.float32),
             rng.integers(0, WIDTHS[-1], BATCH).astype(np.int32)) for _ in range(STEPS)]


def one_process():
    net = model()
    names = dict(net.parameters_and_names())
    step = nn.TrainOneStepCell(nn.WithLossCell(net, LOSS), nn.SGD(net.trainable_params(), 0.1))
    losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in batches()]
    return {n: p.asnumpy() for n, p in names.items()}, losses


def pipe_run(spec, communicator):
    """Core's Engine on `spec["config"]` (schedule, stages, data_parallel); returns it and
    {"weights": {name: list}, "losses": [...]} of this rank."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    net = model()
    names = {id(p): n for n, p in net.parameters_and_names()}
    config = Config(micro_batches=4, batch_size=BATCH, **spec["config"])
    engine = Engine(net, LOSS, lambda params: nn.SGD(params, 0.1), config, MpiWire(communicator))
    losses = [engine.train_step(x, y) for x, y in batches()]
    weights = {names[id(p)]: p.asnumpy().tolist() for c in engine.chunks for p in c.params}
    return engine, {"weights": weights, "losses": losses}
