"""What a whole compiled training step costs the host per call, by what goes in and out:
MindSpore's own step (inputs, labels -> loss) against the same step given one more scalar
tensor, an empty tuple, or three more outputs, bound to a Cell, and pipe's step graph and
train_step, on a model so small that the host's work is all there is.

    python benchmarks/probes/call_cost.py [--device CPU] [--rounds 7]

Prints each one's median microseconds per call (its result read back), over the rounds'
medians; the variants run in turn, round by round, so that all see the same host."""
import os
import statistics
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn, ops  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.dirname(os.path.dirname(HERE))]   # benchmarks/, the root
from timing import median_windows  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, positive_int, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.core.engine import split  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

WIDTH, BATCH = 16, 8


def model():
    ms.set_seed(0)
    return nn.SequentialCell([nn.Dense(WIDTH, WIDTH)])


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def mindspore_steps(x, y):
    """MindSpore's own step as a function under ms.jit, then with more in or out."""
    net = model()
    optimizer = nn.SGD(net.trainable_params(), 1e-3)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss_fn()), None, optimizer.parameters)

    @ms.jit
    def plain(inputs, labels):
        loss, grads = grad_fn(inputs, labels)
        optimizer(grads)
        return loss

    @ms.jit
    def taking(inputs, labels, more):
        loss, grads = grad_fn(inputs, labels)
        optimizer(grads)
        return loss

    @ms.jit
    def giving(inputs, labels):
        loss, grads = grad_fn(inputs, labels)
        optimizer(grads)
        return loss, (), labels, ops.zeros(1, ms.float32)

    class Bound(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = nn.WithLossCell(model(), loss_fn())
            self.optimizer = nn.SGD(self.net.trainable_params(), 1e-3)

        @ms.jit
        def construct(self, inputs, labels):
            loss, grads = ms.value_and_grad(self.net, None, self.optimizer.parameters)(inputs, labels)
            self.optimizer(grads)
            return loss

    one, bound = ms.Tensor(1.0, ms.float32), Bound()
    return {"MindSpore's step (inputs, labels -> loss)": lambda: plain(x, y).asnumpy(),
            "  + a scalar tensor in": lambda: taking(x, y, one).asnumpy(),
            "  + () in": lambda: taking(x, y, ()).asnumpy(),
            "  + (), a tensor, a new tensor out": lambda: giving(x, y)[0].asnumpy(),
            "  as a Cell's construct": lambda: bound(x, y).asnumpy()}


def pipe_steps(device, x, y):
    engine = PipelineEngine(model(), loss_fn(), lambda ps: nn.SGD(ps, 1e-3),
                            PipelineConfig(batch_size=BATCH, device=device, one_graph=True))
    engine.train_step(x, y)              # (its first step compiles the graph)
    batch = split(engine.config, x, y, 0)
    graph, masks = engine.graphs[batch.shapes], engine.dropout_masks(batch, engine.links[batch.shapes])
    args = graph.taken(engine.graph_inputs(graph, batch, masks, engine.loss_grad_scale(None)))
    return {"pipe's step graph": lambda: graph.executor(*args)[0].asnumpy(),
            "pipe's train_step": lambda: engine.train_step(x, y)}


def median_us(step, calls):
    return median_windows(step, 0, calls, 1)[0] * 1e6


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["CPU", "GPU"], default="CPU")
    p.add_argument("--rounds", type=positive_int, default=7)
    p.add_argument("--calls", type=positive_int, default=200)
    args = p.parse_args(argv)
    use_device(args.device)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, WIDTH, BATCH).astype(np.int32))
    steps = {**mindspore_steps(x, y), **pipe_steps(args.device, x, y)}
    for step in steps.values():          # compile, warm up
        median_us(step, 20)
    rounds = [{name: median_us(step, args.calls) for name, step in steps.items()}
              for _ in range(args.rounds)]
    for name in steps:
        print(f"{name:42s} {statistics.median(r[name] for r in rounds):7.1f} us", flush=True)


if __name__ == "__main__":
    cli.run(main)
