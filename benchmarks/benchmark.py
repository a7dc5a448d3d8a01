"""Time one configuration of the MLP benchmark (run_mnist_benchmark.sh runs the sweep).

    python benchmarks/benchmark.py --layers 8 --hidden 1024 --batch-size 64
    mpiexec -n 2 python benchmarks/benchmark.py --stages 2 --schedule 1f1b ...
    msrun --worker_num=2 ... benchmarks/benchmark.py --stages 2 --impl builtin ...

Every rank appends one JSON line (its step time, peak memory and, for pipe, the host's
median microseconds per kind of action: what a step costs outside the device) to --results.
Only the layers a rank runs get random weights; the rest stay zeros, which is quick to
build and never touched by that rank. Step time is the median over --steps timed steps.
"""
import json
import os
import resource
import shutil
import statistics
import sys
import time

os.environ.setdefault("GLOG_v", "3")  # MindSpore logs errors only, unless GLOG_v says otherwise

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.common.initializer import HeUniform, initializer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "mnist"))   # the example's model
from builtin_pipeline import builtin_train_step, set_parallel_context  # noqa: E402
from train import build_model  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, add_precision_flag, positive_int  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402
from pipe.partition import stage_bounds  # noqa: E402
from pipe.trace import Tracer, host_costs, merge_traces  # noqa: E402


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["pipe", "builtin"], default="pipe")
    p.add_argument("--stages", type=positive_int, default=1)
    p.add_argument("--data-parallel", type=positive_int, default=1)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--micro-batches", type=positive_int, default=1)
    p.add_argument("--layers", type=positive_int, default=8)
    p.add_argument("--hidden", type=positive_int, default=1024)
    p.add_argument("--inputs", type=positive_int, default=784, help="input width")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--steps", type=positive_int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", choices=["auto", "CPU", "GPU", "Ascend"], default="auto")
    p.add_argument("--results", default="benchmark.jsonl")
    p.add_argument("--label", default="", help="names this run in the results")
    p.add_argument("--repeat", type=int, default=0,
                   help="which run of this configuration this is (the report takes the median)")
    p.add_argument("--trace", metavar="FILE", help="record one extra step as Chrome trace JSON")
    p.add_argument("--partition", choices=["uniform", "parameters", "time"], default="parameters")
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--defer-wgrad", action="store_true",
                   help="weight gradients once per step, over all micro-batches")
    p.add_argument("--one-graph", action="store_true", help="each step as one compiled graph")
    add_precision_flag(p)
    return p.parse_args(argv)


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


def peak_memory(device):
    if device == "CPU":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return int(ms.runtime.max_memory_allocated())


def timed(step, steps, warmup):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    args = parse_args(argv)
    device = args.device if args.device != "auto" else ("GPU" if shutil.which("nvidia-smi") else "CPU")
    ms.set_device(device)
    P, D = args.stages, args.data_parallel
    rank = 0
    if args.impl == "builtin":           # the parallel context must precede the network
        set_parallel_context(P, D)
        if P * D > 1:
            from mindspore.communication import get_rank, init
            init()
            rank = get_rank()
    model = build_model(args.layers, args.hidden, args.inputs, init="zeros")
    bounds = stage_bounds(model, P, "parameters")
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch_size, args.inputs)).astype(np.float32)
    y = rng.integers(0, 10, args.batch_size).astype(np.int32)

    if args.impl == "builtin":
        stage, replica = rank // D, rank % D
        own_random_weights(model, *bounds[stage], seed=0)
        if args.precision == "fp16":     # its layers cast as pipe's are, the loss float32 (no
            for layer in model.cells():  # loss scale: its pipeline documents no mixed precision)
                layer.to_float(ms.float16)
            loss_fn = Float32Loss(loss_fn)
        optimizer = nn.SGD(model.trainable_params(), learning_rate=1e-3)
        step = builtin_train_step(model, loss_fn, optimizer, P, args.micro_batches, bounds)
        rows = args.batch_size // D
        xs, ys = ms.Tensor(x[replica * rows:(replica + 1) * rows]), ms.Tensor(y[replica * rows:(replica + 1) * rows])
        seconds = timed(lambda: step(xs, ys).asnumpy(), args.steps, args.warmup)
    else:
        ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=bool(args.trace) and device == "CPU")
        config = PipelineConfig(stages=P, data_parallel=D, micro_batches=args.micro_batches,
                                batch_size=args.batch_size, schedule=args.schedule,
                                partition=args.partition, recompute=args.recompute, device=device,
                                defer_wgrad=args.defer_wgrad, one_graph=args.one_graph,
                                precision=args.precision)
        engine = PipelineEngine(model, loss_fn, lambda ps: nn.SGD(ps, learning_rate=1e-3), config,
                                sample=x[:args.batch_size // (D * args.micro_batches)])
        rank, stage = engine.wire.rank, engine.layout.stage
        for first, last in engine.layout.bounds:          # this rank's model chunks
            own_random_weights(model, first, last, seed=0)
        xs, ys = ms.Tensor(x), ms.Tensor(y)
        seconds = timed(lambda: engine.train_step(xs, ys), args.steps, args.warmup)
        engine.tracer = Tracer(rank, "host", device, wait_for_device=False)
        for _ in range(3):
            engine.train_step(xs, ys)
        host = host_costs(engine.tracer.events)
        if args.trace:
            engine.tracer = Tracer(rank, f"rank {rank}: stage {stage}, replica {engine.layout.replica}", device)
            engine.train_step(xs, ys)
            engine.tracer.write(f"{args.trace}.rank{rank}")
            engine.barrier()             # every rank's part written: rank 0 merges them
            if rank == 0:
                merge_traces([f"{args.trace}.rank{r}" for r in range(P * D)], args.trace)

    impl = "pipe-graph" if args.impl == "pipe" and args.one_graph else args.impl
    row = {"label": args.label, "repeat": args.repeat, "impl": impl, "device": device,
           "stages": P, "data_parallel": D,
           "schedule": (args.schedule + "+W*" * args.defer_wgrad) if args.impl == "pipe" else "builtin",
           "micro_batches": args.micro_batches, "layers": args.layers, "hidden": args.hidden,
           "batch_size": args.batch_size, "rank": rank, "stage": stage,
           "step_ms": seconds * 1e3, "samples_per_s": args.batch_size / seconds,
           "peak_memory_bytes": peak_memory(device), "partition": args.partition,
           "recompute": args.recompute, "defer_wgrad": args.defer_wgrad, "one_graph": args.one_graph,
           "precision": args.precision}
    if args.impl == "pipe":
        row["bounds"] = engine.layout.all_bounds
        row["peak_activation_bytes"] = sum(chunk.peak_bytes for chunk in engine.chunks)
        row["host_us"] = host       # median host time per action kind, not waiting for the device
    with open(args.results, "a") as f:   # one short line per rank: appends do not interleave
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    cli.run(main)
