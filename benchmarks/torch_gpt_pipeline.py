"""The GPT benchmark's model with torch.distributed.pipelining: the multi-GPU anchor.

    torchrun --nproc-per-node 2 benchmarks/torch_gpt_pipeline.py --precision fp32

The model, batch, loss and optimizer of benchmarks/torch_gpt.py (pipe's GPT in torch), cut
into one stage per process as pipe cuts it (`pipe.partition.stage_bounds`, uniform: the
embeddings ride with the first blocks, the final norm and head with the last): blocks
evenly, M micro-batches, 1F1B (or another of torch's schedules). The head is tied to the
token table as in pipe: the first and the last stage each hold a copy, their gradients
summed before Adam steps. The benchmark's rows share one padding pattern, so each stage
holds the mask of kept keys rather than receiving it (torch's stages send what needs a
gradient). The loss is the batch's summed cross-entropy / its count of real targets,
micro-batch gradients summed (not averaged). fp16 as torch's recipe: autocast and a loss
scale (a fixed 2**16 here; no step overflows in this benchmark). Writes gpt_benchmark.py's
JSON fields (impl "torch", as torch_pipeline.py's rows) for benchmarks/report.py.
"""
import json
import os
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed import pipelining as pp
except ImportError:      # (one line and exit code 2, as every program here answers)
    print("error: torch is not importable: benchmarks/torch_gpt_pipeline.py times torch's "
          "pipelining; pip install torch", file=sys.stderr)
    sys.exit(2)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import turn  # noqa: E402
from torch_gpt import GPT, IGNORE, PAD, VOCAB, Parser, add_flags, data  # noqa: E402

SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe"}
SCALE = 2.0 ** 16


class Stage(nn.Module):
    """Blocks [first, last) of `gpt`, with the embeddings on the first stage and the final
    norm and the (tied) head on the last; `keep` (1, T): the kept keys of every row."""

    def __init__(self, gpt, first, last, keep):
        super().__init__()
        self.is_first, self.is_last = first == 0, last == len(gpt.blocks)
        self.blocks = nn.ModuleList(gpt.blocks[first:last])
        self.register_buffer("keep", keep)
        if self.is_first:
            self.token, self.position = gpt.token, gpt.position
        if self.is_last:
            self.norm = gpt.norm
            self.head = nn.Parameter(gpt.token.weight.detach().clone())

    def forward(self, x):
        if self.is_first:
            x = self.token(x) + self.position(torch.arange(x.shape[1], device=x.device))
        keep = self.keep.repeat(x.shape[0], 1)
        for block in self.blocks:
            x, keep = block(x, keep)
        return self.norm(x) @ self.head.T if self.is_last else x


def main():
    p = Parser(description=__doc__.splitlines()[0])
    add_flags(p, batch_size=64)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--micro-batches", type=int, default=16)
    args = p.parse_args()
    with turn(args) as wait:
        run(args, wait)


def run(args, wait):
    """Time the step once this process's turn comes (`wait`: timing.turn)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32   # off: fp32 as MindSpore's default computes it
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    gpt = GPT(args.layers, args.width, args.heads, args.context)
    ids, targets = data(args.batch_size, args.context, device)
    bounds = [args.layers * k // world for k in range(world + 1)]
    keep = (ids[:1] != PAD).to(torch.float32)
    stage = Stage(gpt, bounds[rank], bounds[rank + 1], keep).to(device)
    params = sum(q.numel() for q in gpt.parameters())     # (the head tied: counted once)
    del gpt
    count = (targets != IGNORE).sum()
    half = args.precision == "fp16"
    scale = SCALE if half else 1.0

    def loss_fn(logits, target):       # the global batch's token mean, x the loss scale
        total = nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), target.reshape(-1),
                                            ignore_index=IGNORE, reduction="sum")
        return total * (scale / count)

    class Autocast(nn.Module):          # the stage's forward under fp16 autocast
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            with torch.autocast("cuda", dtype=torch.float16, enabled=half):
                return self.inner(x)

    piped = pp.PipelineStage(Autocast(stage), rank, world, device)
    kind = getattr(pp, SCHEDULES[args.schedule])
    try:
        schedule = kind(piped, args.micro_batches, loss_fn=loss_fn, scale_grads=False)
    except TypeError:                   # (a torch without scale_grads sums already)
        schedule = kind(piped, args.micro_batches, loss_fn=loss_fn)
    optimizer = torch.optim.Adam(stage.parameters(), lr=1e-4)
    tied = dist.new_group([0, world - 1]) if world > 1 else None
    first, last = rank == 0, rank == world - 1

    def step():
        optimizer.zero_grad(set_to_none=False)
        schedule.step(*((ids,) if first else ()), **({"target": targets} if last else {}))
        if tied is not None and (first or last):      # the token table and the head: one weight
            grad = stage.token.weight.grad if first else stage.head.grad
            dist.all_reduce(grad, group=tied)
        if half:
            for q in stage.parameters():
                q.grad.div_(scale)
        optimizer.step()

    for _ in range(2):
        step()
    wait()
    windows = []
    for _ in range(args.repeats):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        windows.append((time.perf_counter() - start) / args.steps)
    peak = torch.tensor([torch.cuda.max_memory_allocated()], device=device)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if rank == 0:
        report(args, world, windows, [int(q.item()) for q in peaks], params)
    dist.destroy_process_group()


def report(args, world, windows, peaks, params):
    best = statistics.median(windows)
    tokens = args.batch_size * args.context
    print(f"torch-pipelining {args.schedule} {args.precision} P={world} M={args.micro_batches}: "
          f"{best * 1e3:.1f} ms per step, {tokens / best:,.0f} tokens/s, peak per GPU "
          + " ".join(f"{q / 2**30:.2f}" for q in peaks) + " GiB", flush=True)
    if not args.results:
        return
    flops = tokens * (6 * params + 12 * args.layers * args.context * args.width)
    with open(args.results, "a") as f:
        for repeat, seconds in enumerate(windows):
            f.write(json.dumps({
                "impl": "torch", "model": "gpt", "layers": args.layers,
                "hidden": args.width, "heads": args.heads, "context": args.context,
                "batch_size": args.batch_size, "stages": world, "data_parallel": 1,
                "schedule": args.schedule, "micro_batches": args.micro_batches,
                "precision": args.precision + "+tf32" * args.tf32, "params": params, "flops_per_step": flops,
                "peak_tflops": args.peak_tflops or None, "rank": 0, "stage": 0,
                "repeat": repeat, "step_ms": seconds * 1e3, "samples_per_s": args.batch_size / seconds,
                "tokens_per_s": tokens / seconds, "peak_memory_bytes": max(peaks)}) + "\n")


if __name__ == "__main__":
    main()
