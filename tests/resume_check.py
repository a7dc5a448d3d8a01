"""A checkpoint of an optimizer with a learning rate per parameter group, resumed on the
layout that saved it, where one stage holds no weight of the first group: its groups are
numbered from 0 again, so stage 0's `learning_rate_group_0` is not stage 1's.

    mpiexec -n 2 python tests/resume_check.py DIR

Each rank prints `rank R: <its learning rates before> <after the resume>`."""
import sys

import mindspore as ms
import numpy as np
from launch import loop_config
from mindspore import nn

from pipe.engine import PipelineEngine


def groups(params):
    """Matrices at 0.1, vectors at 0.01; a stage without a matrix has one group."""
    split = [{"params": [p for p in params if p.ndim >= 2], "lr": 0.1},
             {"params": [p for p in params if p.ndim < 2], "lr": 0.01}]
    return nn.AdamWeightDecay([g for g in split if g["params"]], learning_rate=0.001)


def engine():
    ms.set_seed(0)
    model = nn.SequentialCell([nn.Dense(6, 4), nn.LayerNorm((4,))])   # stage 1: vectors only
    return PipelineEngine(model, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                          groups, loop_config(stages=2, micro_batches=2, batch_size=4))


def rates(pipe):
    return {n: round(float(p.asnumpy()), 6) for n, p in pipe.optimizer.parameters_and_names()
            if n.startswith("learning_rate")}


ms.set_device("CPU")
saved = engine()
saved.train_step(np.ones((4, 6), np.float32), np.zeros(4, np.int32))
saved.save(sys.argv[1], 1)
resumed = engine()
resumed.resume(sys.argv[1])
print(f"rank {saved.wire.rank}: {rates(saved)} {rates(resumed)}", flush=True)
