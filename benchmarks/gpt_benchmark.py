"""Time the GPT example's model (examples/gpt/model.py) on one device: pipe or MindSpore's own step.

    python benchmarks/gpt_benchmark.py --impl mindspore                 # MindSpore's own step, one ms.jit
    python benchmarks/gpt_benchmark.py --impl mindspore --micro-batches 4   # ... accumulating 4 micro-batches
    python benchmarks/gpt_benchmark.py --impl pipe --micro-batches 4    # pipe's defaults
    python benchmarks/gpt_benchmark.py --impl pipe --no-one-graph --precision fp16
    mpiexec -n 2 python benchmarks/gpt_benchmark.py --stages 2 --micro-batches 4   # a pipeline (1F1B)
    mpiexec -n 2 python benchmarks/gpt_benchmark.py --stages 2 --micro-batches 4 --schedule zb-v

The model is GPT-2-small-sized by default (12 blocks of width 768, 12 heads, T = 512,
B = 16), over bytes, its head tied to the input embedding, its loss the (sum, count)
token loss; the ids are random bytes with the last eighth of every row padded. Each run
appends one JSON line per timed window to --results: the step's milliseconds, tokens per
second, peak device memory and the model FLOPs utilization (MFU): 6 N + 12 L T d FLOPs per
token (N the parameters, L blocks of width d over T positions: the forward's products
and their two backward ones, attention's included), over --peak-tflops per device. The
lines carry benchmark.py's fields too (`hidden` is the width), so that
benchmarks/report.py shows the GPT as one more model of the headline table.
"""
import json
import os
import sys
import time

os.environ.setdefault("GLOG_v", "3")  # MindSpore logs errors only, unless GLOG_v says otherwise
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import cli  # noqa: E402
from cli import (Parser, add_compute_flags, count, loop_only, positive_int,  # noqa: E402
                 precision_name, use_device)
from timing import add_profile_flag, add_turn_flags, median_windows, turn  # noqa: E402

from pipe.schedules import CHUNKS_PER_STAGE, SCHEDULES  # noqa: E402


def add_model_flags(p):
    """The GPT's size and batch, GPT-2 small's by default (benchmarks/probes use them too)."""
    p.add_argument("--layers", type=positive_int, default=12)
    p.add_argument("--width", type=positive_int, default=768)
    p.add_argument("--heads", type=positive_int, default=12)
    p.add_argument("--context", type=positive_int, default=512, help="T, every row's length")
    p.add_argument("--batch-size", type=positive_int, default=16)


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["pipe", "mindspore"], default="pipe")
    p.add_argument("--stages", type=positive_int, default=1, help="pipe: P ranks, one stage each")
    add_model_flags(p)
    p.add_argument("--micro-batches", type=positive_int, default=1)
    p.add_argument("--partition", choices=["uniform", "blocks"], default="uniform",
                   help="pipe: layers per stage, uniform (pipe's default: the extra layers to the "
                        "first stages), or blocks (the blocks evenly, the embedding with the "
                        "first, the head with the last, as torch_gpt_pipeline.py splits them)")
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b",
                   help="pipe's schedule over --stages ranks (ZB-V and DualPipeV: two chunks a rank)")
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps per window")
    p.add_argument("--warmup", type=count, default=2)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="the device's peak for MFU (0: no MFU), e.g. 67 (H100/H200 fp32), 989 (fp16)")
    p.add_argument("--device", choices=["auto", "CPU", "GPU", "Ascend"], default="auto")
    p.add_argument("--results", default="gpt_benchmark.jsonl")
    p.add_argument("--label", default="")
    p.add_argument("--split", action="store_true",
                   help="pipe's loop (--no-one-graph): trace two more steps and add where each "
                        "rank's time goes to --results + '.split' (one line per rank)")
    add_profile_flag(p)
    add_compute_flags(p)
    add_turn_flags(p)
    args = p.parse_args(argv)
    if args.batch_size % args.micro_batches:
        m = args.micro_batches
        p.error(f"--batch-size {args.batch_size} cannot be split into --micro-batches {m}: it must "
                f"be a multiple of {m}; try --batch-size {max(m, args.batch_size // m * m)}")
    loop_only(p, args, "--split")
    return args


if __name__ == "__main__":   # Ctrl-C and the flags handled before MindSpore loads (seconds)
    cli.stop_on_ctrl_c()         # (else a Ctrl-C while MindSpore loads can be lost)
    ARGS = parse_args()

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn, ops  # noqa: E402

import model as gpt  # noqa: E402  (the example's own module)
from benchmark import peak_memory, profile, set_tf32  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402
from pipe.features.builders import LayerBuilders  # noqa: E402
from pipe.ops.trace import Tracer  # noqa: E402


def data(args):
    """(ids, targets): random bytes, the last eighth of every row padding."""
    rng = np.random.default_rng(0)
    B, T = args.batch_size, args.context
    ids = rng.integers(1, gpt.VOCAB, (B, T + 1)).astype(np.int32)
    ids[:, T - T // 8:] = gpt.PAD
    targets = np.where(ids[:, 1:] == gpt.PAD, gpt.IGNORE, ids[:, 1:]).astype(np.int32)
    return ids[:, :T], targets


def layers(args):
    return gpt.gpt_layers(args.layers, args.width, args.heads, args.context)


class TokenMean(nn.Cell):
    """The model's token mean over float32 logits: the loss MindSpore's training cells take."""

    def __init__(self, model):
        super().__init__()
        self.model, self.loss = model, gpt.TokenLoss()

    def construct(self, ids, targets):
        total, count = self.loss(self.model(ids).astype(ms.float32), targets)
        return total / count


class OwnStep(nn.Cell):
    """MindSpore's own training step: the token mean's gradients and Adam, one graph (with
    `half`: float16 layers, float32 logits, the loss x S and the gradients / S, checked
    finite, Adam stepping whatever they hold: a timing, not a recipe)."""

    def __init__(self, model, half, scale=2.0 ** 16, optimizer=None):
        super().__init__()
        self.token_mean, self.half = TokenMean(model), half
        self.scale = ms.Tensor(scale if half else 1.0, ms.float32)
        self.weights = ms.ParameterTuple(model.trainable_params())
        self.grad = ms.value_and_grad(self.scaled, None, self.weights)
        self.optimizer = optimizer or nn.Adam(self.weights, learning_rate=1e-4)

    def scaled(self, ids, targets):
        return self.token_mean(ids, targets) * self.scale

    def unscaled(self, grads):
        """(the gradients / S, whether every one is finite)."""
        grads = tuple(g / self.scale for g in grads)
        return grads, ops.stack([ops.isfinite(g).all() for g in grads]).all()

    @ms.jit
    def construct(self, ids, targets):
        loss, grads = self.grad(ids, targets)
        grads, finite = self.unscaled(grads)
        return ops.depend(loss / self.scale, self.optimizer(grads)), finite


class AccumulatingStep(OwnStep):
    """MindSpore's own step over M micro-batches, as a MindSpore user accumulates gradients:
    each micro-batch's summed token loss over the whole batch's count, its gradients
    (float32, as the weights) added up, then one Adam step, all one graph; in fp16 the step
    is skipped when a gradient overflowed, with S fixed. The anchor for pipe at M > 1 on
    one device, where the whole batch's step launches a quarter of the kernels."""

    def __init__(self, model, half, micro_batches):
        super().__init__(model, half)
        self.micro_batches = micro_batches
        self.grad = ms.value_and_grad(self.scaled_part, None, self.weights)

    def scaled_part(self, ids, targets, count):
        total, _ = self.token_mean.loss(self.token_mean.model(ids).astype(ms.float32), targets)
        return total / count * self.scale

    @ms.jit
    def construct(self, ids, targets):
        count = (targets != gpt.IGNORE).sum().astype(ms.float32)
        rows = ids.shape[0] // self.micro_batches
        loss, grads = self.grad(ids[:rows], targets[:rows], count)
        for i in range(1, self.micro_batches):
            part_loss, part = self.grad(ids[i * rows:(i + 1) * rows], targets[i * rows:(i + 1) * rows], count)
            loss, grads = loss + part_loss, tuple(a + b for a, b in zip(grads, part))
        grads, finite = self.unscaled(grads)
        if self.half:
            if finite:
                loss = ops.depend(loss, self.optimizer(grads))
        else:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss / self.scale, finite


class LossScaledStep(nn.Cell):
    """MindSpore's own fp16 step, the recipe pipe's fp16 follows: its
    TrainOneStepWithLossScaleCell over float16 layers, a DynamicLossScaleUpdateCell (S from
    pipe's 2**16, halved on an overflow, doubled after 2000 clean steps), the step skipped
    when a gradient overflowed, as one graph. (benchmark.py's MLP step is the same recipe,
    MindSpore's level O2.)"""

    def __init__(self, model, scale=2.0 ** 16):
        super().__init__()
        manager = nn.DynamicLossScaleUpdateCell(scale, 2, 2000)
        self.step = nn.TrainOneStepWithLossScaleCell(
            TokenMean(model), nn.Adam(model.trainable_params(), learning_rate=1e-4), manager)

    @ms.jit
    def construct(self, ids, targets):
        return self.step(ids, targets)


def own_step(args, device, micro_batches):
    """(MindSpore's own step on the GPT, its model): in fp16 on a GPU its loss-scaled recipe
    (on CPU its TrainOneStepWithLossScaleCell checks overflow with an Ascend operator:
    OwnStep there); with M > 1 micro-batches, their gradients accumulated."""
    model = LayerBuilders(layers(args), 0).whole()
    half = args.precision == "fp16"
    if half:
        for layer in model.cells():
            layer.to_float(ms.float16)
    if micro_batches > 1:
        return AccumulatingStep(model, half, micro_batches), model
    return (LossScaledStep(model) if half and device == "GPU" else OwnStep(model, half)), model


def mindspore_step(args, device):
    """MindSpore's own step on the GPT (own_step), at --micro-batches, timed by main."""
    step, model = own_step(args, device, args.micro_batches)
    ids, targets = map(ms.Tensor, data(args))
    place = {"rank": 0, "stage": 0, "impl": "builtin", "defer_wgrad": False, "one_graph": True}
    return lambda: step(ids, targets)[0].asnumpy(), place, count_params(model.trainable_params())


def pipe_step(args, device):
    config = PipelineConfig(stages=args.stages, micro_batches=args.micro_batches, schedule=args.schedule,
                            partition=partition(args),
                            batch_size=args.batch_size, device=device, precision=args.precision,
                            tf32=args.tf32, defer_wgrad=args.defer_wgrad, one_graph=args.one_graph)
    engine = PipelineEngine(layers(args), gpt.TokenLoss(), lambda ps: nn.Adam(ps, 1e-4), config)
    ids, targets = map(ms.Tensor, data(args))
    start = time.perf_counter()          # the first step: the check before it, every compile,
    engine.train_step(ids, targets)      # pipe's choices
    first = time.perf_counter() - start
    params = int(engine.all_reduce("the parameter count", ms.Tensor([count_params(
        engine.layout.params)], ms.float32), tuple(range(engine.wire.size))).asnumpy()[0])
    place = {"rank": engine.wire.rank, "stage": engine.layout.stage}
    modes = engine.modes
    chose = {"defer_wgrad": modes.defer_wgrad, "one_graph": modes.one_graph, **place,
             "impl": "pipe-graph" if modes.one_graph else "pipe", "first_step_s": round(first, 2)}

    def step():
        return engine.train_step(ids, targets)
    step.engine = engine
    return step, chose, params


def kind_of(name):
    """A traced span's share: an action (`F3`, `rB2:1`, `W*`), the all-reduce, or other."""
    if name[:2] in ("rF", "rB"):
        return "receive"
    if name[:2] in ("sF", "sB"):
        return "send"
    return "compute" if name[0] in "FBIW" else "all-reduce" if name == "all-reduce" \
        else "other"


def split(args, step, device, step_seconds):
    """Where this rank's `step` goes: one step traced with each action waiting for the device
    (compute, waiting on and taking a receive, sending, the all-reduce over replicas; the
    rest, the step less these, is the optimizer and the host between actions), and one
    traced without waiting (the host's own time issuing each kind). One JSON line per rank
    in --results + '.split'."""
    engine, sums = step.engine, {}
    for wait in (True, False):
        engine.tracer = Tracer(engine.wire.rank, "split", device, wait_for_device=wait)
        engine.barrier()
        start = time.perf_counter()
        step()
        wall = time.perf_counter() - start
        totals = {}
        for event in engine.tracer.events:
            kind = kind_of(event["name"])
            totals[kind] = totals.get(kind, 0.0) + event["dur"] / 1e3
        sums["device" if wait else "host"] = {**{k: round(v, 2) for k, v in totals.items()},
                                              "step": round(wall * 1e3, 2)}
    engine.tracer = None
    with open(args.results + ".split", "a") as f:
        f.write(json.dumps({"stages": args.stages, "micro_batches": args.micro_batches,
                            "precision": precision_name(args), "rank": engine.wire.rank,
                            "timed_step_ms": round(step_seconds * 1e3, 2), **sums}) + "\n")


def partition(args):
    """pipe's partition of the embedding, the blocks and the head: "uniform", or the blocks
    split evenly (examples/gpt/model.py's `even_blocks`) over the virtual stages."""
    if args.partition == "uniform":
        return "uniform"
    return gpt.even_blocks(args.layers, args.stages * CHUNKS_PER_STAGE.get(args.schedule, 1))


def count_params(params):
    return int(sum(p.size for p in params))


def main(args):
    with turn(args) as wait:
        run(args, wait)


def run(args, wait):
    device = use_device(args.device, args.memory_plan)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    set_tf32(args, device)               # (MindSpore's own step too)
    if device != "CPU":
        ms.runtime.reset_peak_memory_stats()
    step, chose, params = mindspore_step(args, device) if args.impl == "mindspore" else pipe_step(args, device)
    windows = median_windows(step, args.warmup, args.steps, args.repeats, warmed=wait)
    tokens = args.batch_size * args.context
    flops = tokens * (6 * params + 12 * args.layers * args.context * args.width)
    devices = args.stages if args.impl == "pipe" else 1
    common = {"label": args.label, "model": "gpt", "device": device, "layers": args.layers,
              "hidden": args.width, "heads": args.heads, "context": args.context,
              "batch_size": args.batch_size, "stages": devices, "data_parallel": 1,
              "schedule": args.schedule if devices > 1 else "-", "micro_batches": args.micro_batches,
              "precision": precision_name(args), "params": params, "flops_per_step": flops,
              "peak_tflops": args.peak_tflops or None, "devices": devices,
              "peak_memory_bytes": peak_memory(device), **chose}
    with open(args.results, "a") as f:   # one short line per window: appends do not interleave
        for repeat, seconds in enumerate(windows):
            mfu = flops / seconds / (args.peak_tflops * 1e12 * devices) if args.peak_tflops else None
            f.write(json.dumps({**common, "repeat": repeat, "step_ms": seconds * 1e3,
                                "samples_per_s": args.batch_size / seconds,
                                "tokens_per_s": tokens / seconds, "mfu": mfu}) + "\n")
    best = sorted(windows)[len(windows) // 2]
    if args.split and args.impl == "pipe":
        split(args, step, device, best)
    if args.profile:
        profile(step, args.steps, args.profile)
    if chose["rank"] == 0:
        layout = f"P={devices} M={args.micro_batches}" + (f" {args.schedule}" if devices > 1 else "")
        print(f"{args.impl} {precision_name(args)} {layout} "
              f"(defer_wgrad={chose['defer_wgrad']}, one_graph={chose['one_graph']}): "
              f"{best * 1e3:.1f} ms per step, {tokens / best:,.0f} tokens/s, peak "
              f"{peak_memory(device) / 2**30:.2f} GiB" +
              (f", first step {chose['first_step_s']:.1f} s" if "first_step_s" in chose else ""),
              flush=True)


if __name__ == "__main__":
    cli.run(lambda: main(ARGS))
