"""Train a small GPT on Python's own documentation with pipeline parallelism, then sample.

    python examples/gpt/train.py                                      # one process, CPU
    mpiexec -n 4 python examples/gpt/train.py --stages 2 --data-parallel 2
    msrun --worker_num=2 --local_worker_num=2 --join=True \\
        examples/gpt/train.py --stages 2 --device GPU                 # 2 GPUs

Byte-level, with sequences bucketed to 32 or 64 bytes (model.py): the stages agree on
each length the first time it comes. The loss is the token mean over the real bytes of
the whole batch. Every --eval-every steps it prints the loss on held-out text
(`engine.evaluate`, as nanoGPT's estimate_loss), and at the end a short sample, generated
with `engine.predict`.
"""
import os
import sys
import time

os.environ.setdefault("GLOG_v", "3")  # MindSpore logs errors only, unless GLOG_v says otherwise
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the example's own module
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/cli.py
from cli import (BUILDING, PROGRESS, Parser, add_compute_flags, add_layout_flags,  # noqa: E402
                 config_from, count, positive_int, positive_number, run, save, stop_on_ctrl_c,
                 use_device, writable_folder)


def parser():
    p = Parser(description=__doc__.split("\n")[0])
    add_layout_flags(p, batch_size=32)
    add_compute_flags(p)
    p.add_argument("--layers", type=positive_int, default=4, help="transformer blocks")
    p.add_argument("--width", type=positive_int, default=64, help="model width (4 heads)")
    p.add_argument("--steps", type=positive_int, default=300)
    p.add_argument("--lr", type=positive_number, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample", type=count, default=80, metavar="N", help="bytes to generate at the end")
    p.add_argument("--save", type=writable_folder, metavar="DIR", help="checkpoint here at the end")
    p.add_argument("--device", choices=["auto", "CPU", "GPU", "Ascend"], default="auto")
    p.add_argument("--log-every", type=positive_int, default=25)
    p.add_argument("--eval-every", type=count, default=100, metavar="N",
                   help="the loss on held-out text every N steps and at the end (0: never)")
    return p


def parse_args(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.width % 4:
        p.error(f"--width {args.width} must be a multiple of 4: the model splits it into 4 heads")
    return args


if __name__ == "__main__":   # Ctrl-C and the flags handled before MindSpore loads (seconds)
    stop_on_ctrl_c()
    ARGS = parse_args()

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402

import model  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402


def generate(engine, prompts, length, rng):
    """Each prompt continued by `length` bytes, sampled from the model one byte at a time:
    every prompt is a row of one predict call (eval mode, all stages)."""
    texts = [bytearray(p) for p in prompts]
    width = max(model.BUCKETS)
    for _ in range(length):
        window = [t[-width:] for t in texts]
        ids, _ = model.pad([bytes(w) + b" " for w in window], width)   # (pad's target byte)
        logits = engine.predict(ids)
        for t, w, row in zip(texts, window, logits):
            p = np.exp(row[len(w) - 1] - row[len(w) - 1].max())
            t.append(int(rng.choice(model.VOCAB, p=p / p.sum())))
    return [bytes(t).decode("utf-8", "replace") for t in texts]


def train(args, wire=None):
    """Train as `args` say, then sample; returns the engine. `wire` overrides the launcher's."""
    PROGRESS.at = BUILDING
    ms.set_context(mode=ms.PYNATIVE_MODE)
    device = use_device(args.device, args.memory_plan)
    config = config_from(args, device=device)     # every flag named after a config field
    config.partition = model.even_blocks(args.layers, config.stages * config.chunks_per_stage)
    engine = PipelineEngine(model.gpt_layers(args.layers, args.width), model.TokenLoss(),
                            lambda params: model.optimizer(params, args.lr), config, wire)
    say = print if engine.wire.rank == 0 else (lambda *a, **k: None)
    pieces, held = model.held_out(model.paragraphs())
    say(f"config: {config}\nmodel: GPT, {args.layers} blocks of width {args.width}, layers per "
        f"stage {engine.layout.all_bounds}; text: Python's documentation, {len(pieces)} "
        f"paragraphs, {sum(map(len, pieces))} bytes ({len(held)} more held out)")
    stream = model.batches(pieces, args.batch_size, args.seed)
    validation = model.batches(held, args.batch_size, args.seed)
    validation = [next(validation) for _ in range(4)]     # the same 4 batches each time
    say("compiling: the first step, and the first of each new sequence length, take longer",
        flush=True)
    start = last = time.perf_counter()
    for step in range(1, args.steps + 1):
        PROGRESS.at = f"during step {step} of {args.steps}"
        ids, targets = next(stream)
        loss = engine.train_step(ids, targets)
        PROGRESS.at = f"after step {step} of {args.steps}"
        now = time.perf_counter()        # a line every --log-every steps, and at least every 10 s
        if step % args.log_every == 0 or step in (1, args.steps) or now - last >= 10:
            say(f"step {step:5d}  length {ids.shape[1]:3d}  loss {loss:.4f}  "
                f"{now - start:5.1f} s", flush=True)
            last = now
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            held_out = np.mean([engine.evaluate(*batch) for batch in validation])   # eval mode
            say(f"step {step:5d}  held-out loss {held_out:.4f}", flush=True)
    say(f"{args.steps} steps in {time.perf_counter() - start:.1f} s (each new length compiles once)")
    if args.save:
        save(engine, args.save, args.steps)
        say(f"saved {os.path.join(args.save, 'model.ckpt')}")
    if args.sample:
        prompts = [b"The ", b"A list ", b"Return ", b"If the "][:args.micro_batches]
        prompts = (prompts * args.micro_batches)[:args.micro_batches]
        for text in generate(engine, prompts, args.sample, np.random.default_rng(args.seed)):
            say("sample: " + repr(text))
    return engine


if __name__ == "__main__":
    run(lambda: train(ARGS))
