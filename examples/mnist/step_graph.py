"""Probe (issue 12): one process's whole training step as ONE graph, built from a chunk's
compiled pieces (pipe.chunk: forward keeping residuals, backward from them, accumulation)
and the optimizer, against the engine running them one call per action.

    python examples/mnist/step_graph.py [M]      (CPU, the 3 x 256 MLP, B=64, SGD, 30 steps)

Prints the largest weight difference after 30 steps (0.0: the same bits) and the median
step of each. Recorded in docs/benchmarks.md, section 12, with the 2-GPU probe
(one_graph_step.py) that puts the messages in the graph too.
"""
import os
import statistics
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import build_model  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

B = 64


class StepGraph(nn.Cell):
    """F B F B ... over the micro-batches (1F1B on one stage), the gradients summed as the
    engine sums them, then the optimizer: every piece is the engine's own compiled cell."""

    def __init__(self, chunk, optimizer, micro_batches):
        super().__init__(auto_prefix=False)
        self.forward, self.backward, self.scale = chunk._forward, chunk._backward, chunk._scale
        self.optimizer = optimizer
        self.micro_batches = micro_batches

    @ms.jit
    def construct(self, xs, ys):
        (loss, dlogits), saved = self.forward(xs[0], ys[0], self.scale, ())
        _, grads = self.backward(dlogits, (), *saved)
        total = loss
        for m in range(1, self.micro_batches):
            (loss, dlogits), saved = self.forward(xs[m], ys[m], self.scale, ())
            _, grads = self.backward(dlogits, grads, *saved)
            total = total + loss
        self.optimizer(grads)
        return total / self.micro_batches


def engine(micro_batches):
    ms.set_seed(0)
    config = PipelineConfig(stages=1, micro_batches=micro_batches, batch_size=B)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return PipelineEngine(build_model(3, 256), loss_fn, lambda ps: nn.SGD(ps, learning_rate=0.1),
                          config)


def main(micro_batches):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((B, 784)).astype(np.float32),
             rng.integers(0, 10, B).astype(np.int32)) for _ in range(30)]
    per_action, one_graph = engine(micro_batches), engine(micro_batches)
    step = StepGraph(one_graph.chunks[0], one_graph.optimizer, micro_batches)
    one_graph.chunks[0]._mode(True)
    rows = B // micro_batches
    times = ([], [])
    for x, y in data:
        start = time.perf_counter()
        per_action.train_step(ms.Tensor(x), ms.Tensor(y))
        times[0].append(time.perf_counter() - start)
        start = time.perf_counter()
        xs = ms.mutable(tuple(ms.Tensor(x[i * rows:(i + 1) * rows]) for i in range(micro_batches)))
        ys = ms.mutable(tuple(ms.Tensor(y[i * rows:(i + 1) * rows]) for i in range(micro_batches)))
        step(xs, ys).asnumpy()
        times[1].append(time.perf_counter() - start)
    diff = max(float(np.abs(a.asnumpy() - b.asnumpy()).max())
               for a, b in zip(per_action.layout.params, one_graph.layout.params))
    print(f"M={micro_batches}: largest weight difference after 30 steps {diff}; median step: "
          f"per action {statistics.median(times[0][5:]) * 1e3:.2f} ms, "
          f"one graph {statistics.median(times[1][5:]) * 1e3:.2f} ms")


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "4"
    if not arg.isdigit() or not 1 <= int(arg) <= B or B % int(arg):
        print(f"error: micro-batches {arg}: use a divisor of the batch ({B}), e.g. 4",
              file=sys.stderr)
        sys.exit(2)
    main(int(arg))
