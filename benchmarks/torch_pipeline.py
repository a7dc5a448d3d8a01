"""The benchmark's MLP trained with torch.distributed.pipelining: the comparison row.

    torchrun --nproc-per-node 2 benchmarks/torch_pipeline.py --schedule zb-v,1f1b   (on GPUs)

Same model as benchmarks/benchmark.py (L x (Dense H + ReLU), then Dense 10, fp32,
TF32 off), same batch, micro-batches, SGD and layer split (`split`), one process per
GPU over NCCL (gloo on CPU). Prints the median step of rank 0 in milliseconds, and with
--results adds its rows to pipe's table (run_mnist_benchmark.sh does, when torch imports).
torch is not a dependency of pipe: this script is the only file that imports it.
"""
import argparse
import json
import os
import resource
import statistics
import sys

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed import pipelining as pp
except ImportError:      # (one line and exit code 2, as every program here answers)
    print("error: torch is not importable: benchmarks/torch_pipeline.py times torch's step; "
          "pip install torch", file=sys.stderr)
    sys.exit(2)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import add_turn_flags, median_windows, turn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from cli import Parser, positive_int  # noqa: E402  (no MindSpore needed)

SCHEDULES = {"1f1b": ("Schedule1F1B", 1), "interleaved-1f1b": ("ScheduleInterleaved1F1B", 2),
             "zb-v": ("ScheduleZBVZeroBubble", 2), "dualpipe-v": ("ScheduleDualPipeV", 2)}


def blocks(layers, hidden, inputs):
    widths = [inputs] + [hidden] * layers
    return [nn.Sequential(nn.Linear(a, hidden), nn.ReLU()) for a in widths[:-1]] + \
        [nn.Linear(hidden, 10)]


def split(parts, count):
    """`count` contiguous groups: the hidden blocks evenly, the output layer with the last.
    For this MLP that is pipe's partition='parameters' (the 8192 x 10 head is 0.01% of the
    parameters; e.g. 17 layers in 2: 8 | 8 + head, in 4: 4 | 4 | 4 | 4 + head)."""
    hidden = len(parts) - 1
    bounds = [hidden * k // count for k in range(count)] + [len(parts)]
    return [nn.Sequential(*parts[a:b]) for a, b in zip(bounds, bounds[1:])]


def schedule_list(text):
    names = text.split(",")
    for name in names:
        if name not in SCHEDULES:
            raise argparse.ArgumentTypeError(f"{name}: use {', '.join(SCHEDULES)}, or several with commas")
    return names


def train(args, name, rank, world, device, wait):
    """The windows of `name`'s schedule on this rank's stages, built afresh."""
    torch.manual_seed(0)
    kind, chunks = SCHEDULES[name]
    count = world * chunks
    parts = split(blocks(args.layers, args.hidden, args.inputs), count)
    held = [rank, count - 1 - rank] if name in ("zb-v", "dualpipe-v") else \
        [rank + c * world for c in range(chunks)]
    stages = [pp.PipelineStage(parts[i].to(device), i, count, device) for i in held]
    params = [q for stage in stages for q in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    schedule = getattr(pp, kind)(stages if chunks > 1 else stages[0], args.micro_batches,
                                 loss_fn=nn.CrossEntropyLoss())
    x = torch.randn(args.batch_size, args.inputs, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    first, last = 0 in held, count - 1 in held

    def step():
        optimizer.zero_grad()
        inputs = (x,) if first else ()
        schedule.step(*inputs, **({"target": y} if last else {}))
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    # rank 0's time, each step after a barrier: every rank starts it together
    return median_windows(step, args.warmup, args.steps, args.repeats, before=dist.barrier,
                          warmed=wait)


def main():
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--schedule", type=schedule_list, default=["zb-v"],
                   help="one of " + ", ".join(SCHEDULES) + ", or several with commas")
    p.add_argument("--layers", type=positive_int, default=16)
    p.add_argument("--hidden", type=positive_int, default=8192)
    p.add_argument("--inputs", type=positive_int, default=8192)
    p.add_argument("--batch-size", type=positive_int, default=1024)
    p.add_argument("--micro-batches", type=positive_int, default=8)
    p.add_argument("--steps", type=positive_int, default=20, help="timed steps per window")
    p.add_argument("--repeats", type=positive_int, default=1, help="windows (the report takes the median)")
    p.add_argument("--warmup", type=positive_int, default=3)
    p.add_argument("--results", help="append a JSON line per schedule and window (benchmarks/report.py)")
    p.add_argument("--tf32", action="store_true", help="float32 products in TF32 (as pipe's --tf32)")
    add_turn_flags(p)
    args = p.parse_args()
    with turn(args) as wait:
        run(args, wait)


def run(args, wait):
    """Every schedule of `args`, timed once this process's turn comes (`wait`: timing.turn)."""
    gpu = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if gpu else "cpu")
    if gpu:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    dist.init_process_group("nccl" if gpu else "gloo")
    for name in args.schedule:
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        windows = train(args, name, rank, world, device, wait)
        if rank != 0:
            continue
        print(f"torch {name} {world} ranks M={args.micro_batches}: median step "
              f"{statistics.median(windows) * 1e3:.2f} ms", flush=True)
        if args.results:
            with open(args.results, "a") as f:
                for repeat, seconds in enumerate(windows):
                    f.write(json.dumps({
                        "impl": "torch", "schedule": name, "stages": world, "data_parallel": 1,
                        "micro_batches": args.micro_batches, "layers": args.layers,
                        "hidden": args.hidden, "batch_size": args.batch_size,
                        "precision": "fp32+tf32" if args.tf32 else "fp32",
                        "rank": 0, "stage": 0, "repeat": repeat, "step_ms": seconds * 1e3,
                        "samples_per_s": args.batch_size / seconds,
                        "peak_memory_bytes": torch.cuda.max_memory_allocated() if gpu else
                        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
