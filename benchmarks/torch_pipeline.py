"""The benchmark's MLP trained with torch.distributed.pipelining: the comparison row.

    torchrun --nproc-per-node 2 benchmarks/torch_pipeline.py --schedule zbv   (on GPUs)

Same model as benchmarks/benchmark.py (L x (Dense H + ReLU), then Dense 10, fp32,
TF32 off), same batch, micro-batches, SGD and layer split (`split`), one process per
GPU over NCCL (gloo on CPU). Prints the median step of rank 0 in milliseconds. torch is not
a dependency of pipe: this script is the only file that imports it.
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining as pp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipe.cli import Parser, positive_int  # noqa: E402  (no MindSpore needed)

SCHEDULES = {"1f1b": ("Schedule1F1B", 1), "interleaved": ("ScheduleInterleaved1F1B", 2),
             "zbv": ("ScheduleZBVZeroBubble", 2), "dualpipev": ("ScheduleDualPipeV", 2)}


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


def main():
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="zbv")
    p.add_argument("--layers", type=positive_int, default=16)
    p.add_argument("--hidden", type=positive_int, default=8192)
    p.add_argument("--inputs", type=positive_int, default=8192)
    p.add_argument("--batch-size", type=positive_int, default=1024)
    p.add_argument("--micro-batches", type=positive_int, default=8)
    p.add_argument("--steps", type=positive_int, default=20)
    p.add_argument("--warmup", type=positive_int, default=3)
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if gpu else "cpu")
    if gpu:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("nccl" if gpu else "gloo")
    torch.manual_seed(0)
    kind, chunks = SCHEDULES[args.schedule]
    count = world * chunks
    parts = split(blocks(args.layers, args.hidden, args.inputs), count)
    held = [rank, count - 1 - rank] if args.schedule in ("zbv", "dualpipev") else \
        [rank + c * world for c in range(chunks)]
    stages = [pp.PipelineStage(parts[i].to(device), i, count, device) for i in held]
    params = [q for stage in stages for q in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    schedule = getattr(pp, kind)(stages if chunks > 1 else stages[0], args.micro_batches,
                                 loss_fn=loss_fn)
    x = torch.randn(args.batch_size, args.inputs, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    first, last = 0 in held, count - 1 in held

    def step():
        optimizer.zero_grad()
        inputs = (x,) if first else ()
        schedule.step(*inputs, **({"target": y} if last else {}))
        optimizer.step()
        if gpu:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if rank == 0:
        print(f"torch {args.schedule} {world} ranks M={args.micro_batches}: median step "
              f"{statistics.median(times) * 1e3:.2f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
