"""A model whose stages do not fit together: layer 1 wants 12 features, layer 0 gives 16.

    mpiexec -n 2 python tests/bad_shapes.py   # both fail: rank 1 names the boundary, rank 0 rank 1
"""
import sys

import mindspore as ms
import numpy as np
from launch import loop_config
from mindspore import nn

from pipe.engine import PipelineEngine, PipelineError

ms.set_device("CPU")
model = nn.SequentialCell([nn.Dense(8, 16), nn.Dense(12, 4)])
config = loop_config(stages=2, micro_batches=2, batch_size=8, timeout=20.0)
engine = PipelineEngine(model, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                        lambda params: nn.SGD(params, learning_rate=0.1), config)
try:
    engine.train_step(np.zeros((8, 8), np.float32), np.zeros(8, np.int32))
except (RuntimeError, PipelineError) as e:
    print(f"rank {engine.wire.rank} error: {e}", file=sys.stderr, flush=True)
    sys.exit(1)
