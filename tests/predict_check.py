"""predict() on the ranks of a communicator (in the suite's one launch: tests/mpi_worker.py):
with broadcast every rank gets the single-process outputs; without it only the last stage
does. `pipe_run` returns what each rank saw; tests/test_predict.py checks it."""
import mindspore as ms
import numpy as np
from launch import loop_config
from mindspore import nn

from pipe.engine import PipelineEngine
from pipe.ops.deadlines import DeadlineWire


def pipe_run(spec, communicator):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(11)
    model = nn.SequentialCell([nn.SequentialCell([nn.Dense(w, 8), nn.ReLU()]) for w in (6, 8, 8)] +
                              [nn.Dense(8, 5)])
    x = np.random.default_rng(0).standard_normal((12, 6)).astype(np.float32)
    expected = model(ms.Tensor(x)).asnumpy()        # the whole model, in this one process
    config = loop_config(micro_batches=3, batch_size=12, **spec["config"])
    engine = PipelineEngine(model, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                            lambda params: nn.SGD(params, learning_rate=0.1), config,
                            DeadlineWire(120.0, communicator))
    shared, local = engine.predict(x), engine.predict(x, broadcast=False)
    same = lambda got: bool(np.allclose(got, expected, rtol=1e-5, atol=1e-6))
    return engine, {"broadcast": same(shared), "own": None if local is None else same(local)}
