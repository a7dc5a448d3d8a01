"""Time one configuration of the MLP benchmark (run_mnist_benchmark.sh runs them).

    python benchmarks/benchmark.py --layers 8 --hidden 1024 --batch-size 64
    mpiexec -n 2 python benchmarks/benchmark.py --stages 2 --schedule zb-v,dualpipe-v,1f1b ...
    msrun --worker_num=2 ... benchmarks/benchmark.py --stages 2 --impl builtin ...

Every rank appends one JSON line per schedule and window to --results: its step time, peak
memory and, for pipe, what pipe chose (deferred W, one graph) and the host's median
microseconds per kind of action (what a step costs outside the device). A window's step
time is the median over --steps timed steps; --repeats windows follow each other in one
process, and several schedules run one engine after another on one wire (one launch).
Only the layers a rank runs get random weights; the rest stay zeros, which is quick to
build and never touched by that rank.
"""
import json
import os
import resource
import sys

os.environ.setdefault("GLOG_v", "3")  # MindSpore logs errors only, unless GLOG_v says otherwise
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "mnist"))   # the example's model
sys.path.insert(0, os.path.join(ROOT, "examples"))
import cli  # noqa: E402
from cli import (Parser, add_compute_flags, count, loop_only, positive_int,  # noqa: E402
                 precision_name, use_device)
from timing import add_profile_flag, add_turn_flags, host_costs, median_windows, turn  # noqa: E402


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["pipe", "builtin"], default="pipe")
    p.add_argument("--stages", type=positive_int, default=1)
    p.add_argument("--data-parallel", type=positive_int, default=1)
    p.add_argument("--schedule", default="1f1b",
                   help="a schedule, or several with commas: one engine after another")
    p.add_argument("--micro-batches", type=positive_int, default=1)
    p.add_argument("--layers", type=positive_int, default=8)
    p.add_argument("--hidden", type=positive_int, default=1024)
    p.add_argument("--inputs", type=positive_int, default=784, help="input width")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--steps", type=positive_int, default=20, help="timed steps")
    p.add_argument("--warmup", type=count, default=3)
    p.add_argument("--device", choices=["auto", "CPU", "GPU", "Ascend"], default="auto")
    p.add_argument("--results", default="benchmark.jsonl")
    p.add_argument("--label", default="", help="names this run in the results")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="time this many windows of --steps steps (the report takes the median)")
    p.add_argument("--trace", metavar="STEM", help="record one extra step as Chrome trace JSON, "
                                                    "STEM-SCHEDULE.json")
    p.add_argument("--partition", choices=["uniform", "parameters", "time"], default="parameters")
    p.add_argument("--recompute", action="store_true")
    add_profile_flag(p)
    add_compute_flags(p)
    add_turn_flags(p)
    args = p.parse_args(argv)
    loop_only(p, args, "--trace")
    return args


if __name__ == "__main__":   # Ctrl-C and the flags handled before MindSpore loads (seconds)
    cli.stop_on_ctrl_c()         # (else a Ctrl-C while MindSpore loads can be lost)
    ARGS = parse_args()

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.common.initializer import HeUniform, initializer  # noqa: E402

from builtin_pipeline import builtin_train_step, mixed_precision_step, set_parallel_context  # noqa: E402
from train import build_model  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402
from pipe.features.precision import set_matmul_precision  # noqa: E402
from pipe.ops.trace import Tracer, merge_traces  # noqa: E402
from pipe.partition import stage_bounds  # noqa: E402


class Float32Loss(nn.Cell):
    """`loss_fn` on float32 logits (MindSpore's GPU cross-entropy takes no float16)."""

    def __init__(self, loss_fn):
        super().__init__()
        self.loss_fn = loss_fn

    def construct(self, logits, labels):
        return self.loss_fn(logits.astype(ms.float32), labels)


def own_random_weights(model, first, last, seed):
    """Give layers first..last-1 real random weights (HeUniform, as nn.Dense would)."""
    ms.set_seed(seed + first)
    for i in range(first, last):
        for p in model[i].trainable_params():
            p.set_data(initializer(HeUniform() if p.ndim > 1 else "zeros", p.shape, p.dtype))


def set_tf32(args, device):
    """--tf32 for MindSpore's own step as well (the reference multiplies as pipe does),
    refused off GPU as pipe's config refuses it."""
    config = PipelineConfig(device=device, tf32=args.tf32)
    config.check()
    set_matmul_precision(config)


def peak_memory(device):
    if device == "CPU":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return int(ms.runtime.max_memory_allocated())


def profile(step, steps, folder):
    """`steps` more calls of `step` under MindSpore's profiler, into `folder`: the device's
    kernels with CUPTI's timestamps, taken without a sync after each kernel (which would
    change the step). benchmarks/busy.py reads them."""
    from mindspore.profiler import ProfilerActivity
    profiler = ms.Profiler(start_profile=False, output_path=folder, sync_enable=False,
                           activities=[ProfilerActivity.CPU, ProfilerActivity.GPU])
    profiler.start()
    for _ in range(steps):
        step()
    profiler.stop()
    profiler.analyse()


def timed(step, args):
    """The median step time of each of `args.repeats` windows of `args.steps` steps, after
    `args.warmup` steps: the report takes the median window."""
    return median_windows(step, args.warmup, args.steps, args.repeats, warmed=args.wait)


def builtin_run(args, device, model, bounds, loss_fn, x, y):
    """MindSpore's own pipeline (or its plain step on one device): (rank, stage, windows)."""
    P, D = args.stages, args.data_parallel
    rank = 0
    if P * D > 1:
        from mindspore.communication import get_rank, init
        init()
        rank = get_rank()
    stage, replica = rank // D, rank % D
    own_random_weights(model, *bounds[stage], seed=0)
    optimizer = nn.SGD(model.trainable_params(), learning_rate=1e-3)
    if args.precision == "fp16" and P * D == 1 and device == "GPU":
        step = mixed_precision_step(model, loss_fn, optimizer)     # its O2: loss scaled, as pipe's
    else:
        if args.precision == "fp16":     # its layers cast as pipe's are, the loss float32 (no loss
            for layer in model.cells():  # scale: its pipeline documents no mixed precision, and
                layer.to_float(ms.float16)   # on CPU it has no dynamic loss scale)
            loss_fn = Float32Loss(loss_fn)
        step = builtin_train_step(model, loss_fn, optimizer, P, args.micro_batches, bounds)
    rows = args.batch_size // D
    xs, ys = ms.Tensor(x[replica * rows:(replica + 1) * rows]), ms.Tensor(y[replica * rows:(replica + 1) * rows])
    return rank, stage, timed(lambda: step(xs, ys).asnumpy(), args)


def pipe_run(args, device, schedule, wire, x, y):
    """pipe's engine with `schedule`, on `wire` (None: the launcher's): (engine, windows, host
    microseconds per action kind)."""
    P, D = args.stages, args.data_parallel
    model = build_model(args.layers, args.hidden, args.inputs, init="zeros")
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    config = PipelineConfig(stages=P, data_parallel=D, micro_batches=args.micro_batches,
                            batch_size=args.batch_size, schedule=schedule,
                            partition=args.partition, recompute=args.recompute, device=device,
                            defer_wgrad=args.defer_wgrad, one_graph=args.one_graph,
                            precision=args.precision, tf32=args.tf32)
    engine = PipelineEngine(model, loss_fn, lambda ps: nn.SGD(ps, learning_rate=1e-3), config,
                            wire, sample=x[:args.batch_size // (D * args.micro_batches)])
    for first, last in engine.layout.bounds:          # this rank's model chunks
        own_random_weights(model, first, last, seed=0)
    xs, ys = ms.Tensor(x), ms.Tensor(y)
    windows = timed(lambda: engine.train_step(xs, ys), args)
    rank = engine.wire.rank
    engine.tracer = Tracer(rank, "host", device, wait_for_device=False)
    for _ in range(3):
        engine.train_step(xs, ys)
    host = host_costs(engine.tracer.events)
    engine.tracer = None
    if args.profile:                     # (a folder per schedule: busy.py reads one)
        profile(lambda: engine.train_step(xs, ys), args.steps, os.path.join(args.profile, schedule))
    if args.trace:
        trace = f"{args.trace}-{schedule}.json"
        engine.tracer = Tracer(rank, f"rank {rank}: stage {engine.layout.stage}, replica "
                                     f"{engine.layout.replica}", device)
        engine.train_step(xs, ys)
        engine.tracer.write(f"{trace}.rank{rank}")
        engine.barrier()                 # every rank's part written: rank 0 merges them
        if rank == 0:
            merge_traces([f"{trace}.rank{r}" for r in range(P * D)], trace)
    return engine, windows, host


def main(args):
    with turn(args) as args.wait:        # (timed when this process's turn comes: timing.turn)
        run(args)


def run(args):
    device = use_device(args.device, args.memory_plan)
    P, D = args.stages, args.data_parallel
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch_size, args.inputs)).astype(np.float32)
    y = rng.integers(0, 10, args.batch_size).astype(np.int32)
    common = {"label": args.label, "device": device, "stages": P, "data_parallel": D,
              "micro_batches": args.micro_batches, "layers": args.layers, "hidden": args.hidden,
              "batch_size": args.batch_size, "partition": args.partition,
              "recompute": args.recompute, "precision": precision_name(args)}
    set_tf32(args, device)               # (MindSpore's own step too)
    rows = []
    if args.impl == "builtin":           # the parallel context must precede the network
        set_parallel_context(P, D)
        model = build_model(args.layers, args.hidden, args.inputs, init="zeros")
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        rank, stage, windows = builtin_run(args, device, model, stage_bounds(model, P, "parameters"),
                                           loss_fn, x, y)
        rows.append(({"impl": "builtin", "schedule": "builtin", "defer_wgrad": False,
                      "one_graph": True, "rank": rank, "stage": stage,
                      "peak_memory_bytes": peak_memory(device)}, windows))
    else:
        ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=bool(args.trace) and device == "CPU")
        wire = None
        for schedule in args.schedule.split(","):         # one engine after another, one wire
            if device != "CPU":
                ms.runtime.reset_peak_memory_stats()
            engine, windows, host = pipe_run(args, device, schedule, wire, x, y)
            wire = engine.wire
            modes = engine.modes
            rows.append(({"impl": "pipe-graph" if modes.one_graph else "pipe",
                          "schedule": schedule + "+W*" * modes.defer_wgrad,
                          "defer_wgrad": modes.defer_wgrad, "one_graph": modes.one_graph,
                          "rank": wire.rank, "stage": engine.layout.stage,
                          "peak_memory_bytes": peak_memory(device),
                          "bounds": engine.layout.all_bounds,
                          "peak_activation_bytes": engine.memory.peak,
                          "host_us": host}, windows))   # host: median per action kind
            del engine
    with open(args.results, "a") as f:   # one short line per rank and window: appends do not interleave
        for row, windows in rows:
            for repeat, seconds in enumerate(windows):
                f.write(json.dumps({**common, **row, "repeat": repeat, "step_ms": seconds * 1e3,
                                    "samples_per_s": args.batch_size / seconds}) + "\n")


if __name__ == "__main__":
    cli.run(lambda: main(ARGS))
