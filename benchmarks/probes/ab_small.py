"""The small MLP's step, MindSpore's own against pipe's defaults, in one process, window by
window in turn (A B A B ...), so that both see the same host: on one H200 the two figures
moved by more than they differ between runs made one process after the other.

    python benchmarks/probes/ab_small.py [--rounds 10] [--steps 50]

The model and batch of the headline (8 x 1024, 784 inputs, B=64, M=1, SGD), fp32
(benchmarks/probes/small_turns.py takes fp16 too). Prints each
one's median over its windows' medians and the median of the rounds' ratios."""
import os
import statistics
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmark import build_model, own_random_weights  # noqa: E402
from builtin_pipeline import builtin_train_step, mixed_precision_step  # noqa: E402
from timing import median_windows  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, positive_int, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.core.engine import split  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

LAYERS, HIDDEN, INPUTS, BATCH = 8, 1024, 784, 64


def batch():
    """The headline's small batch, (inputs, labels) as tensors (seed 0)."""
    rng = np.random.default_rng(0)
    return (ms.Tensor(rng.standard_normal((BATCH, INPUTS)).astype(np.float32)),
            ms.Tensor(rng.integers(0, 10, BATCH).astype(np.int32)))


def mindspore_step(x, y, precision="fp32"):
    """MindSpore's own compiled step (fp16: its loss-scaled O2 recipe, GPU only)."""
    model = build_model(LAYERS, HIDDEN, INPUTS, init="zeros")
    own_random_weights(model, 0, LAYERS + 1, seed=0)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.SGD(model.trainable_params(), learning_rate=1e-3)
    step = (mixed_precision_step(model, loss_fn, optimizer) if precision == "fp16"
            else builtin_train_step(model, loss_fn, optimizer, 1, 1, None))
    return lambda: step(x, y).asnumpy()


def pipe_step(device, x, y, precision="fp32"):
    model = build_model(LAYERS, HIDDEN, INPUTS, init="zeros")
    config = PipelineConfig(batch_size=BATCH, device=device, precision=precision)
    engine = PipelineEngine(model, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                            lambda ps: nn.SGD(ps, learning_rate=1e-3), config)
    own_random_weights(model, 0, LAYERS + 1, seed=0)
    engine.train_step(x, y)              # (its first step builds the graph)
    batch = split(engine.config, x, y, 0)
    graph, masks = engine.graphs[batch.shapes], engine.dropout_masks(batch, engine.links[batch.shapes])
    args = graph.taken(engine.graph_inputs(graph, batch, masks, engine.loss_grad_scale(None)))
    return (lambda: engine.train_step(x, y)), (lambda: graph.executor(*args)[0].asnumpy()), engine


def window(step, steps):
    """The median of `steps` calls, in milliseconds (one window of benchmark.py's timing)."""
    return median_windows(step, 0, steps, 1)[0] * 1e3


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=positive_int, default=10)
    p.add_argument("--steps", type=positive_int, default=50)
    p.add_argument("--device", choices=["CPU", "GPU"], default="GPU")
    args = p.parse_args(argv)
    use_device(args.device)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, y = batch()
    pipe, graph, _ = pipe_step(args.device, x, y)
    steps = {"mindspore": mindspore_step(x, y),
             "pipe": pipe, "graph": graph}
    for step in steps.values():          # compile, warm up
        window(step, 5)
    rounds = [{name: window(step, args.steps) for name, step in steps.items()} for _ in range(args.rounds)]
    ms_ms = statistics.median(r["mindspore"] for r in rounds)
    pipe_ms = statistics.median(r["pipe"] for r in rounds)
    ratio = statistics.median(r["pipe"] / r["mindspore"] for r in rounds)
    print(f"fp32: MindSpore's step {ms_ms:.3f} ms, pipe's {pipe_ms:.3f} ms; "
          f"pipe / MindSpore per round: median {ratio:.3f}, range "
          f"{min(r['pipe'] / r['mindspore'] for r in rounds):.3f}-"
          f"{max(r['pipe'] / r['mindspore'] for r in rounds):.3f}; pipe's graph called alone "
          f"{statistics.median(r['graph'] for r in rounds):.3f} ms", flush=True)


if __name__ == "__main__":
    cli.run(main)
