"""pipe.core alone trains what one process trains: GPipe and 1F1B at 2x1, 3x1 and 2x2.

    mpiexec -n 4 python tests/core_check.py

Imports nothing from pipe outside pipe.core. Each configuration runs on its own ranks (an
MPI sub-communicator); every rank compares its stage's parameters, and every step's loss,
with MindSpore's TrainOneStepCell on the whole batch, and prints one line per configuration.
"""
import mindspore as ms
import numpy as np
from mindspore import nn
from mpi4py import MPI

from pipe.core.config import Config
from pipe.core.engine import Engine
from pipe.core.wire import MpiWire

WIDTHS, BATCH, STEPS = (12, 16, 16, 16, 10), 8, 3
LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
LAYOUTS = [[("gpipe", 2, 1), ("1f1b", 2, 1)], [("gpipe", 3, 1)], [("1f1b", 3, 1)],
           [("gpipe", 2, 2)], [("1f1b", 2, 2)]]     # waves of (schedule, P, D) side by side


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


def pipelined(schedule, stages, replicas, communicator):
    net = model()
    names = {id(p): n for n, p in net.parameters_and_names()}
    config = Config(stages=stages, data_parallel=replicas, micro_batches=4, batch_size=BATCH,
                    schedule=schedule)
    engine = Engine(net, LOSS, lambda params: nn.SGD(params, 0.1), config, MpiWire(communicator))
    losses = [engine.train_step(x, y) for x, y in batches()]
    return {names[id(p)]: p.asnumpy() for c in engine.chunks for p in c.params}, losses


def main():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    world, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank()
    want, want_losses = one_process()
    for wave in LAYOUTS:
        first, mine, color = 0, None, MPI.UNDEFINED
        for k, (schedule, stages, replicas) in enumerate(wave):
            if first <= rank < first + stages * replicas:
                mine, color = (schedule, stages, replicas), k
            first += stages * replicas
        communicator = world.Split(color, rank)
        if mine is None:
            continue
        got, losses = pipelined(*mine, communicator)
        worst = max(float(np.abs(got[n] - want[n]).max()) for n in got)
        exact = np.allclose(losses, want_losses, rtol=1e-6) and worst < 1e-6
        print(f"{mine[0]} {mine[1]}x{mine[2]} rank {communicator.Get_rank()}: "
              f"{'equal' if exact else 'DIFFERENT'} to one process ({len(got)} parameters, "
              f"largest difference {worst:.1e})", flush=True)
        communicator.Free()


if __name__ == "__main__":
    main()
