"""A user's model failing on one rank of two ends both ranks at once, each saying what it knows.

    mpiexec -n 2 python tests/failure_check.py before   # each case caught on every rank
    mpiexec -n 2 python tests/failure_check.py during   # a backward fails mid-step, uncaught
    mpiexec -n 2 python tests/failure_check.py batches  # each rank its own batch, uncaught
    msrun --worker_num=2 ... tests/failure_check.py during GPU    # the same over NCCL

`before`: every case fails before the first step, on one rank or both (one graph that
does not compile on one rank: before any message); each rank prints
`CASE: rank R: <its error's first line>` and goes on to the next case (nothing is left
waiting). `during`: rank 1's first backward raises and nobody catches it; the job must end
well inside the 300 s deadline, rank 0 with one line naming rank 1.
"""
import sys

import mindspore as ms
import numpy as np
from launch import loop_config
from mindspore import nn
from user_layers import Attending, HiddenDropout, NoBackward, Tagging, TiedHead, Untagging

from pipe.engine import PipelineEngine
from pipe.ops.deadlines import connect

DEVICE = sys.argv[2] if len(sys.argv) > 2 else "CPU"
ms.set_device(DEVICE)
WIRE = connect(DEVICE, 300.0)            # one wire for every case
LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
X, Y = np.ones((4, 8), np.float32), np.zeros(4, np.int32)


def engine(model, **config):
    return PipelineEngine(model, LOSS, lambda ps: nn.SGD(ps, learning_rate=0.1),
                          loop_config(stages=2, micro_batches=2, batch_size=4, device=DEVICE,
                                         **config), WIRE)


EMBEDDING = nn.Embedding(8, 8)
CASES = {
    "tuple": lambda: engine(nn.SequentialCell([nn.Dense(8, 8), nn.Dense(8, 8), Attending(8),
                                               nn.Dense(8, 3)])),
    "no-backward-one-graph": lambda: engine(nn.SequentialCell([nn.Dense(8, 8), nn.Dense(8, 8), NoBackward(),
                                                               nn.Dense(8, 3)]), one_graph=True),
    "uint16": lambda: engine(nn.SequentialCell([nn.Dense(8, 8), Tagging(), Untagging(), nn.Dense(8, 3)])),
    "random": lambda: engine(nn.SequentialCell([nn.Dense(8, 8), HiddenDropout(8), nn.Dense(8, 3)])),
    "targets": lambda: engine(nn.SequentialCell([nn.Dense(8, 8), nn.Dense(8, 3)])),
    "tied-builders": lambda: engine([lambda: nn.Dense(8, 8), lambda: TiedHead(EMBEDDING)]),
    "batches": lambda: engine(nn.SequentialCell([nn.Dense(8, 8), nn.Dense(8, 3)])),
}
if sys.argv[1] == "during":
    pipe = engine(nn.SequentialCell([nn.Dense(8, 8), nn.Dense(8, 8), NoBackward(), nn.Dense(8, 3)]))
    pipe.train_step(X, Y)
    print(f"rank {WIRE.rank}: the step passed", flush=True)
rank = WIRE.rank
if sys.argv[1] == "batches":             # uncaught, raised alike on both ranks
    CASES["batches"]().train_step(X + rank, Y)
for name, build in CASES.items():
    try:
        inputs = X + rank if name == "batches" else X      # (each rank its own batch)
        build().train_step(inputs, Y.astype(np.float32) if name == "targets" else Y)
        print(f"{name}: rank {rank}: trained", flush=True)
    except Exception as error:
        print(f"{name}: rank {rank}: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
