"""TF32 is the user's choice and exact: with `tf32=True` pipe trains the weights that
MindSpore's own step trains with TF32 on, and the switch changes them (one GPU).

    python benchmarks/probes/tf32_exact.py --save /root/tf32.npz     # TF32 on
    python benchmarks/probes/tf32_exact.py --no-tf32 --against /root/tf32.npz

The GPT example's model at 4 blocks of width 256 (4 heads, T = 128, B = 8), its token
loss, 3 Adam steps from one initialization: MindSpore's own step (gpt_benchmark.OwnStep),
then pipe's per-action loop and its step as one graph (M = 1, W per micro-batch). Prints
the largest difference of any weight between each of pipe's runs and MindSpore's; with
--against (MindSpore's weights from a run with the other setting: MindSpore's switch is one
per process) also how far TF32 moved them, which shows that the switch reached the products.
"""
import argparse
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import gpt_benchmark  # noqa: E402
from gpt_benchmark import OwnStep, data, gpt, layers  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.builders import LayerBuilders  # noqa: E402
from pipe.cli import Parser, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402
from pipe.precision import set_matmul_precision  # noqa: E402

SIZE = ["--layers", "4", "--width", "256", "--heads", "4", "--context", "128", "--batch-size", "8"]
STEPS = 3
OPTIMIZERS = {"adam": lambda ps: nn.Adam(ps, 1e-4), "sgd": lambda ps: nn.SGD(ps, 1e-2)}


def mindspore_weights(args, batch, make_optimizer):
    model = LayerBuilders(layers(args), 0).whole()
    names = [p.name for p in model.trainable_params()]     # (before the step renames them)
    step = OwnStep(model, half=False, optimizer=make_optimizer(model.trainable_params()))
    for _ in range(STEPS):
        step(*batch)
    return {n: p.asnumpy() for n, p in zip(names, model.trainable_params())}


def pipe_weights(args, batch, make_optimizer, config):
    engine = PipelineEngine(layers(args), gpt.TokenLoss(), make_optimizer, config)
    for _ in range(STEPS):
        engine.train_step(*batch)
    return {name: p.asnumpy() for name, p in engine.parameters_dict().items()}


def largest_difference(a, b):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def main():
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--device", choices=["GPU", "CPU"], default="GPU")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    p.add_argument("--save", help="write MindSpore's weights here (.npz)")
    p.add_argument("--against", type=cli.existing_file, help="MindSpore's weights from the other setting")
    args = p.parse_args()
    use_device(args.device)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    config = PipelineConfig(device=args.device, tf32=args.tf32, batch_size=8, defer_wgrad=False)
    config.check()
    set_matmul_precision(config)         # (MindSpore's step first: one switch per process)
    model_args = gpt_benchmark.parse_args(SIZE + ["--device", args.device])
    make_optimizer = OPTIMIZERS[args.optimizer]
    batch = tuple(map(ms.Tensor, data(model_args)))
    own = mindspore_weights(model_args, batch, make_optimizer)
    print(f"tf32={args.tf32}: {len(own)} weights after {STEPS} steps")
    for one_graph in (False, True):
        run = PipelineConfig(**{**vars(config), "one_graph": one_graph})
        got = pipe_weights(model_args, batch, make_optimizer, run)
        print(f"  pipe {'one graph' if one_graph else 'loop'} against MindSpore's step: largest "
              f"difference {largest_difference(own, got):.3g}", flush=True)
    if args.save:
        np.savez(args.save, **own)
    if args.against:
        other = dict(np.load(args.against))
        print(f"  MindSpore's step, tf32={args.tf32} against the other setting: largest "
              f"difference {largest_difference(own, other):.3g}")


if __name__ == "__main__":
    cli.run(main)
