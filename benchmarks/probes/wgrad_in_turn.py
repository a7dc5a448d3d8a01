"""The GPT's W at M micro-batches, per micro-batch or deferred, against MindSpore's steps, in turn.

    python benchmarks/probes/wgrad_in_turn.py --precision fp16 --micro-batches 4 [--no-one-graph]

One process to the next moves an M=4 step by up to 20%, so this builds, in one process:
pipe with W per micro-batch; pipe with W deferred (every layer's rows joined, one product
per layer: split_backward.rows_of); MindSpore's whole-batch step and its M micro-batches
accumulated. Each takes one step in turn, `--steps` times; medians in milliseconds. In
section 41 of benchmarks/log.md (e59b1ec, 7bf66e7) it also ran the rule that joined only
some layers' rows, and the rows flattened before each Concat: neither was faster.
"""
import os
import statistics
import sys
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 2)[0])     # benchmarks/
import gpt_benchmark  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, positive_int, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402


def pipe_step(args, ids, targets, defer):
    """One pipe engine's step."""
    config = PipelineConfig(stages=1, micro_batches=args.micro_batches, batch_size=args.batch_size,
                            device=args.device, precision=args.precision, defer_wgrad=defer,
                            one_graph=args.one_graph)
    engine = PipelineEngine(gpt_benchmark.layers(args), gpt_benchmark.gpt.TokenLoss(),
                            lambda ps: nn.Adam(ps, 1e-4), config)
    return lambda: engine.train_step(ids, targets)


def own_step(args, ids, targets, micro_batches):
    step, _ = gpt_benchmark.own_step(args, args.device, micro_batches)
    return lambda: step(ids, targets)[0].asnumpy()


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp16")
    p.add_argument("--device", choices=["CPU", "GPU"], default="GPU")
    gpt_benchmark.add_model_flags(p)
    p.add_argument("--micro-batches", type=positive_int, default=4)
    p.add_argument("--one-graph", action="store_true", default=True)
    p.add_argument("--no-one-graph", dest="one_graph", action="store_false")
    p.add_argument("--steps", type=positive_int, default=20)
    args = p.parse_args(argv)
    use_device(args.device)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ids, targets = map(ms.Tensor, gpt_benchmark.data(args))
    steps = {"pipe, W per micro-batch": pipe_step(args, ids, targets, False),
             "pipe, W deferred, rows joined": pipe_step(args, ids, targets, True),
             "MindSpore, whole batch": own_step(args, ids, targets, 1),
             f"MindSpore, {args.micro_batches} accumulated": own_step(args, ids, targets, args.micro_batches)}
    times = {name: [] for name in steps}
    for step in steps.values():          # compile and warm up
        for _ in range(3):
            step()
    for _ in range(args.steps):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    graph = "one graph" if args.one_graph else "the loop"
    print(f"{args.precision}, M={args.micro_batches}, {graph}, median of {args.steps} steps in turn:")
    for name, ts in times.items():
        print(f"  {name:38s} {statistics.median(ts) * 1e3:8.2f} ms")
    return 0


if __name__ == "__main__":
    cli.run(main)
