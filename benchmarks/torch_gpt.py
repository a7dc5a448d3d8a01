"""The GPT benchmark's model in torch, one device: the anchor a user would pick instead.

The same math as `examples/gpt/model.py` at `benchmarks/gpt_benchmark.py`'s sizes: byte
embeddings and positions, pre-norm blocks (causal attention over kept keys written out, a
4x GELU MLP), the head tied to the token table, the summed cross-entropy over real targets
/ their count, Adam; fp16 as torch's recipe (autocast, GradScaler). Imports no MindSpore.

    python benchmarks/torch_gpt.py --precision fp32      # or fp16; --device cpu

--results appends one JSON line per window in gpt_benchmark.py's fields (impl "torch"), so
that benchmarks/report.py shows it beside MindSpore's step and pipe's (run_mnist_benchmark.sh
does, when torch imports). A window is --steps steps between two device syncs: torch's
step runs ahead of the host as a training loop's does.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import add_turn_flags, turn  # noqa: E402  (no MindSpore, no torch)

try:
    import torch
    from torch import nn
except ImportError:      # (one line and exit code 2, as every program here answers)
    print("error: torch is not importable: benchmarks/torch_gpt.py times torch's step; "
          "pip install torch", file=sys.stderr)
    sys.exit(2)

VOCAB, PAD, IGNORE = 256, 0, -1


class Parser(argparse.ArgumentParser):
    """A bad value in one line and exit code 2, as every pipe program answers (examples/cli.py,
    which this script does not import: it imports MindSpore)."""

    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x, keep):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q = q / math.sqrt(d // self.heads)
        q, k, v = [z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v)]
        allowed = torch.tril(torch.ones(t, t, dtype=torch.int32, device=x.device)) * keep.view(b, 1, 1, t) > 0
        scores = q @ k.transpose(-1, -2)
        scores = scores.masked_fill(~allowed, -1e4)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x)), approximate="tanh")), keep


class GPT(nn.Module):
    def __init__(self, layers, width, heads, context):
        super().__init__()
        self.token, self.position = nn.Embedding(VOCAB, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)

    def forward(self, ids):
        keep = (ids != PAD).to(torch.int32)
        x = self.token(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x, keep = block(x, keep)
        return self.norm(x) @ self.token.weight.T


def data(batch_size, context, device):
    """The benchmark's batch: random bytes, the last eighth of every row padding."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, (batch_size, context + 1)).astype(np.int64)
    ids[:, context - context // 8:] = PAD
    targets = np.where(ids[:, 1:] == PAD, IGNORE, ids[:, 1:])
    return torch.tensor(ids[:, :context], device=device), torch.tensor(targets, device=device)


def add_flags(p, batch_size):
    """The model's size, batch, precision and timing, as gpt_benchmark.py names them."""
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=0.0, help="the device's peak for MFU (0: none)")
    p.add_argument("--results", help="append a JSON line per window (benchmarks/report.py)")
    p.add_argument("--tf32", action="store_true", help="float32 products in TF32 (as pipe's --tf32)")
    add_turn_flags(p)


def main():
    p = Parser(description=__doc__.splitlines()[0])
    add_flags(p, batch_size=16)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    with turn(args) as wait:
        run(args, wait)


def run(args, wait):
    """Time the step once this process's turn comes (`wait`: timing.turn)."""
    torch.backends.cuda.matmul.allow_tf32 = args.tf32      # off: fp32 as MindSpore's default computes it
    model = GPT(args.layers, args.width, args.heads, args.context).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    half = args.precision == "fp16"
    scaler = torch.amp.GradScaler(enabled=half)
    ids, targets = data(args.batch_size, args.context, args.device)

    def step():
        with torch.autocast(args.device.split(":")[0], dtype=torch.float16, enabled=half):
            logits = model(ids)
        total = nn.functional.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1),
                                            ignore_index=IGNORE, reduction="sum")
        loss = total / (targets != IGNORE).sum()
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(2):
        step()
    wait()
    windows = []
    for _ in range(args.repeats):
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        windows.append((time.perf_counter() - start) / args.steps)
    best = statistics.median(windows)
    peak = torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024       # (the process's, on CPU)
    print(f"torch {args.precision} P=1 M=1: {best * 1e3:.1f} ms per step, "
          f"{args.batch_size * args.context / best:,.0f} tokens/s, peak {peak / 2**30:.2f} GiB", flush=True)
    if args.results:
        write_results(args, model, windows, peak)


def write_results(args, model, windows, peak):
    """One JSON line per window, as gpt_benchmark.py writes them (its FLOP count: 6 N +
    12 L T d per token, N the parameters, the tied table once)."""
    params = sum(p.numel() for p in model.parameters())
    tokens = args.batch_size * args.context
    flops = tokens * (6 * params + 12 * args.layers * args.context * args.width)
    precision = args.precision + "+tf32" * args.tf32      # (examples/cli.py precision_name's)
    with open(args.results, "a") as f:
        for repeat, seconds in enumerate(windows):
            f.write(json.dumps({
                "impl": "torch", "model": "gpt", "layers": args.layers, "hidden": args.width,
                "heads": args.heads, "context": args.context, "batch_size": args.batch_size,
                "stages": 1, "data_parallel": 1, "schedule": "-", "micro_batches": 1,
                "precision": precision, "params": params, "flops_per_step": flops,
                "peak_tflops": args.peak_tflops or None, "rank": 0, "stage": 0,
                "repeat": repeat, "step_ms": seconds * 1e3, "samples_per_s": args.batch_size / seconds,
                "tokens_per_s": tokens / seconds, "peak_memory_bytes": peak}) + "\n")


if __name__ == "__main__":
    main()
