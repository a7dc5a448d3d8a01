"""Where an fp16 step's device time goes: MindSpore's own step against pipe's, kernel by kernel.

    python benchmarks/probes/fp16_trace.py --model large --impl mindspore --trace /root/t
    python benchmarks/probes/fp16_trace.py --model gpt --impl pipe --trace /root/t
    python benchmarks/probes/fp16_trace.py --model gpt --impl pipe --micro-batches 4 --[no-]defer-wgrad

Models as the benchmark has them (the large and small MLPs, the GPT-2-small-sized GPT);
impls: `mindspore` (its own compiled step as benchmarks/benchmark.py and gpt_benchmark.py
time it: the MLP's with no loss scale), `mindspore-scaled` (the MLP's, with the loss
scaled by S and the gradients divided by S and checked finite, as the GPT's own step does
and pipe does), `pipe` (pipe's defaults), `pipe-update-outside` (the same, its optimizer
stepped after the graph, as with several replicas). Prints the median step over 3 windows
(with --host-profile, the host's costliest Python calls over 10 more steps), then traces 3 steps (benchmarks/probes/device_trace.py: it needs libcupti.so on
LD_LIBRARY_PATH) and prints each step's busy time and its costliest kernels. pipe's GPT
takes --micro-batches and the speed flags (what deferring W costs, kernel by kernel).
`--turns DIR --turn K` compiles beside other processes and times and traces in turn
(benchmarks/timing.py).
"""
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import gpt_benchmark  # noqa: E402
import timing  # noqa: E402
from benchmark import Float32Loss, build_model, own_random_weights, peak_memory  # noqa: E402
from builtin_pipeline import builtin_train_step  # noqa: E402
from device_trace import summary, trace  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, add_speed_flags, positive_int, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

SIZES = {"large": (16, 8192, 8192, 1024), "small": (8, 1024, 784, 64)}   # layers, hidden, inputs, batch
TRACED = 3


class ScaledStep(gpt_benchmark.OwnStep):
    """MindSpore's own MLP step with a static loss scale: the loss x S, the gradients / S,
    checked finite, then SGD (the GPT's own step with the MLP's loss and optimizer)."""

    def __init__(self, model, loss_fn):
        super().__init__(model, True, optimizer=nn.SGD(model.trainable_params(), learning_rate=1e-3))
        self.net = nn.WithLossCell(model, loss_fn)

    def scaled(self, x, y):
        return self.net(x, y) * self.scale


def mlp_step(args):
    layers, hidden, inputs, batch = SIZES[args.model]
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((batch, inputs)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, batch).astype(np.int32))
    model = build_model(layers, hidden, inputs, init="zeros")
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if args.impl.startswith("pipe"):
        config = PipelineConfig(micro_batches=1, batch_size=batch, device=args.device,
                                precision=args.precision)
        engine = PipelineEngine(model, loss_fn, lambda ps: nn.SGD(ps, learning_rate=1e-3), config)
        own_random_weights(model, 0, len(model), seed=0)
        return lambda: engine.train_step(x, y)
    own_random_weights(model, 0, len(model), seed=0)
    if args.precision == "fp16":
        for layer in model.cells():
            layer.to_float(ms.float16)
        loss_fn = Float32Loss(loss_fn)
    if args.impl == "mindspore-scaled":
        step = ScaledStep(model, loss_fn)
        return lambda: step(x, y)[0].asnumpy()
    step = builtin_train_step(model, loss_fn, nn.SGD(model.trainable_params(), learning_rate=1e-3),
                              1, 1, None)
    return lambda: step(x, y).asnumpy()


def gpt_step(args):
    speed = [f"--{'' if on else 'no-'}{name}" for name, on in
             (("one-graph", args.one_graph), ("defer-wgrad", args.defer_wgrad)) if on is not None]
    gargs = gpt_benchmark.parse_args(["--precision", args.precision, "--micro-batches",
                                      str(args.micro_batches), *speed])
    if args.impl.startswith("pipe"):
        return gpt_benchmark.pipe_step(gargs, args.device)[0]
    return gpt_benchmark.mindspore_step(gargs, args.device)[0]


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["large", "small", "gpt"], default="large")
    p.add_argument("--impl", choices=["mindspore", "mindspore-scaled", "pipe", "pipe-update-outside"],
                   default="pipe")
    p.add_argument("--host-profile", action="store_true")
    p.add_argument("--graph-kernel", action="store_true",
                   help="MindSpore's graph kernel fusion on (on the GPU kit: its kernel build fails)")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp16")
    p.add_argument("--trace", metavar="DIR", help="trace 3 steps into DIR and summarize them")
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--device", choices=["GPU", "CPU"], default="GPU", help="CPU: a smoke test")
    p.add_argument("--micro-batches", type=positive_int, default=1,
                   help="the GPT only: pipe's M, or MindSpore's own step accumulating M micro-batches")
    add_speed_flags(p)
    timing.add_turn_flags(p)
    args = p.parse_args(argv)
    with timing.turn(args) as wait:
        run(args, wait)
    return 0


def run(args, wait):
    use_device(args.device)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    if args.graph_kernel:
        ms.set_context(enable_graph_kernel=True)
    if args.impl == "pipe-update-outside":
        import pipe.engine
        pipe.engine.updates_in_graph = lambda layout: False
    step = gpt_step(args) if args.model == "gpt" else mlp_step(args)
    windows = timing.median_windows(step, args.warmup, args.steps, args.repeats, warmed=wait)
    print(f"{args.model} {args.impl} {args.precision}{' graph-kernel' * args.graph_kernel}: {sorted(windows)[len(windows) // 2] * 1e3:.2f} ms per step "
          f"(windows {', '.join(f'{w * 1e3:.2f}' for w in windows)}), peak "
          f"{peak_memory(args.device) / 2**30:.2f} GiB", flush=True)
    if args.host_profile:
        import cProfile
        import pstats
        profile = cProfile.Profile()
        profile.runcall(lambda: [step() for _ in range(10)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(14)
    if args.trace:
        trace(step, TRACED, args.trace)
        print("\n".join(summary(args.trace, TRACED, top=25)), flush=True)


if __name__ == "__main__":
    cli.run(main)
