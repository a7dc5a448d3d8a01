"""predict() on the ranks of a communicator (in the suite's one launch: tests/mpi_worker.py):
with broadcast every rank gets the single-process outputs; without it only the last stage
does; evaluate() gives every rank the single-process loss. `pipe_run` returns what each rank saw; tests/test_predict.py checks it."""
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
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((12, 6)).astype(np.float32), rng.integers(0, 5, 12).astype(np.int32)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    expected = model(ms.Tensor(x))                  # the whole model, in this one process
    expected_loss = float(loss_fn(expected, ms.Tensor(y)).asnumpy())
    config = loop_config(micro_batches=3, batch_size=12, **spec["config"])
    engine = PipelineEngine(model, loss_fn, lambda params: nn.SGD(params, learning_rate=0.1),
                            config, DeadlineWire(120.0, communicator))
    shared, local = engine.predict(x), engine.predict(x, broadcast=False)
    same = lambda got: bool(np.allclose(got, expected.asnumpy(), rtol=1e-5, atol=1e-6))
    loss = engine.evaluate(x, y)
    return engine, {"broadcast": same(shared), "own": None if local is None else same(local),
                    "loss": bool(np.isclose(loss, expected_loss, rtol=1e-6)) and loss > 0}
