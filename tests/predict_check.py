"""predict() under mpiexec: with broadcast every rank gets the single-process outputs; without
it only the last stage does. Prints one line per rank, or fails.

    mpiexec -n 4 python tests/predict_check.py STAGES DP
"""
import sys

import mindspore as ms
import numpy as np
from mindspore import nn

from pipe.config import PipelineConfig
from pipe.engine import PipelineEngine

stages, data_parallel = int(sys.argv[1]), int(sys.argv[2])
ms.set_device("CPU")
ms.set_seed(11)
model = nn.SequentialCell([nn.SequentialCell([nn.Dense(w, 8), nn.ReLU()]) for w in (6, 8, 8)] + [nn.Dense(8, 5)])
x = np.random.default_rng(0).standard_normal((12, 6)).astype(np.float32)
expected = model(ms.Tensor(x)).asnumpy()        # the whole model, in this one process
config = PipelineConfig(stages=stages, data_parallel=data_parallel, micro_batches=3, batch_size=12)
engine = PipelineEngine(model, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                        lambda params: nn.SGD(params, learning_rate=0.1), config)
shared = engine.predict(x)
np.testing.assert_allclose(shared, expected, rtol=1e-5, atol=1e-6)
local = engine.predict(x, broadcast=False)
if engine.chunks[-1].is_last:
    np.testing.assert_allclose(local, expected, rtol=1e-5, atol=1e-6)
else:
    assert local is None
print(f"rank {engine.wire.rank}: broadcast outputs equal; own outputs "
      f"{'equal' if local is not None else 'None'}", flush=True)
