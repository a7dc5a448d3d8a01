"""Where the host's time goes in one GPT step: pipe's phases against MindSpore's call.

    python benchmarks/probes/step_phases.py --precision fp16 [--steps 30] [--layers 12 ...]
    python benchmarks/probes/step_phases.py --micro-batches 4 [--defer-wgrad] [--no-one-graph]
    python benchmarks/probes/step_phases.py --micro-batches 4 [--no-memory-plan] [--turns DIR --turn K]

On a GPU the device idles whenever the host has not yet launched its next kernel; a step
that reads its loss back starts with the device idle, so everything the host does before
the step graph's first kernel is time the device waits. This times, step by step, each
phase of pipe's `train_step` (by wrapping the engine's methods on this one instance, and
its step graph with a proxy): the batch's token count (`loss_weight`: until 3cde4a4 the
count run and read before the step; since, its read after the step, which counted it),
the graph's call (until it returns), the overflow flag's and the loss's reads; and
MindSpore's own step as its call and its loss's read. `--loss mean` gives pipe the token
mean as a scalar instead of (sum, count): no count at all. pipe's step takes M micro-batches
(`--micro-batches`, 1 by default) and its modes as the benchmarks' flags set them;
MindSpore's takes the whole batch at once, and at M > 1 also the M micro-batches with
their gradients accumulated (`gpt_benchmark.AccumulatingStep`), the three in turn.
Medians over the steps, in milliseconds. `--no-memory-plan` leaves MindSpore allocating
device memory at each kernel (pipe.cli's `plan_memory` says why it does not); `--turns DIR
--turn K` compiles beside other processes and times in turn (benchmarks/timing.py).
"""
import os
import statistics
import sys
import time
from collections import defaultdict

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 2)[0])     # benchmarks/
import gpt_benchmark  # noqa: E402
import timing  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, add_memory_plan_flag, add_speed_flags, positive_int, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

TIMES = defaultdict(list)


def timed(name, call):
    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        out = call(*args, **kwargs)
        TIMES[name].append(time.perf_counter() - start)
        return out
    return wrapped


class TimedGraph:
    """A step graph's stand-in that times its call (until the call returns)."""

    def __init__(self, graph):
        self.graph = graph

    def __getattr__(self, name):
        return getattr(self.graph, name)

    def call(self, *inputs):
        return timed("  graph call (returns)", self.graph.call)(*inputs)


class ScalarMean(nn.Cell):
    def __init__(self):
        super().__init__()
        self.loss = gpt_benchmark.gpt.TokenLoss()

    def construct(self, logits, targets):
        total, count = self.loss(logits, targets)
        return total / count


def pipe_steps(args, ids, targets):
    config = PipelineConfig(stages=1, micro_batches=args.micro_batches, batch_size=args.batch_size,
                            device=args.device, precision=args.precision,
                            defer_wgrad=args.defer_wgrad, one_graph=args.one_graph)
    loss = gpt_benchmark.gpt.TokenLoss() if args.loss == "token" else ScalarMean()
    engine = PipelineEngine(gpt_benchmark.layers(args), loss, lambda ps: nn.Adam(ps, 1e-4), config)
    engine.train_step(ids, targets)
    for shapes, graph in engine.graphs.items():
        engine.graphs[shapes] = TimedGraph(graph)
    for name, label in (("loss_weight", "  the token count (loss_weight)"),
                        ("run_actions", "  run_actions (graph call + overflow read)"),
                        ("step_loss", "  step_loss (the loss read)")):
        setattr(engine, name, timed(label, getattr(engine, name)))
    return timed(f"pipe step ({args.loss} loss)", lambda: engine.train_step(ids, targets))


def mindspore_steps(args, ids, targets, micro_batches=1):
    """MindSpore's own step: the whole batch, or M micro-batches' gradients accumulated."""
    step, _ = gpt_benchmark.own_step(args, args.device, micro_batches)
    which = "" if micro_batches == 1 else ", accumulating"
    call = timed(f"  its call (returns){which}", step)
    read = timed(f"  the loss read{which}", lambda out: out[0].asnumpy())
    name = "MindSpore's step" + (f", {micro_batches} micro-batches accumulated" if micro_batches > 1 else "")
    return timed(name, lambda: read(call(ids, targets)))


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp16")
    p.add_argument("--loss", choices=["token", "mean"], default="token")
    p.add_argument("--device", choices=["CPU", "GPU"], default="GPU")
    gpt_benchmark.add_model_flags(p)
    p.add_argument("--micro-batches", type=positive_int, default=1, help="pipe's M")
    add_speed_flags(p)
    p.add_argument("--steps", type=positive_int, default=30)
    add_memory_plan_flag(p)
    timing.add_turn_flags(p)
    args = p.parse_args(argv)
    with timing.turn(args) as wait:
        run(args, wait)
    return 0


def run(args, wait):
    use_device(args.device, args.memory_plan)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ids, targets = map(ms.Tensor, gpt_benchmark.data(args))
    steps = [mindspore_steps(args, ids, targets), pipe_steps(args, ids, targets)]
    if args.micro_batches > 1:
        steps.append(mindspore_steps(args, ids, targets, args.micro_batches))
    for step in steps:                   # warm up; then the steps in turn, step by step
        for _ in range(3):
            step()
    wait()
    TIMES.clear()
    for _ in range(args.steps):
        for step in steps:
            step()
    for name, times in TIMES.items():
        print(f"{name:45s} {statistics.median(times) * 1e3:9.3f} ms  ({len(times)} calls)", flush=True)


if __name__ == "__main__":
    cli.run(main)
