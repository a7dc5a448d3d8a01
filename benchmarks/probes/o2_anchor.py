"""MindSpore's fp16 O2 training cell on the small MLP called as a Cell in PyNative mode
against the same cell under one `ms.jit` (builtin_pipeline.mixed_precision_step), and
pipe's fp16 step, step by step in turn in one process (GPU only). pipe's ratio here is not
the one to quote: it mostly follows the Cell's step, whose queued operators it waits for
(benchmarks/probes/small_turns.py --precision fp16 compares it with the compiled one alone).

    python benchmarks/probes/o2_anchor.py [--steps 300]
"""
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import ab_small  # noqa: E402
from benchmark import build_model, own_random_weights  # noqa: E402
from timing import in_turn, print_against_first  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, positive_int, use_device  # noqa: E402


def o2_cell(x, y):
    model = build_model(ab_small.LAYERS, ab_small.HIDDEN, ab_small.INPUTS, init="zeros")
    own_random_weights(model, 0, ab_small.LAYERS + 1, seed=0)
    cell = ms.amp.build_train_network(
        model, nn.SGD(model.trainable_params(), learning_rate=1e-3),
        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), level="O2",
        loss_scale_manager=ms.amp.DynamicLossScaleManager(2.0 ** 16, 2, 2000))
    cell.set_train()
    return lambda: cell(x, y)[0].asnumpy()


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=positive_int, default=300)
    args = p.parse_args(argv)
    use_device("GPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, y = ab_small.batch()
    steps = {"O2 cell, under one jit": ab_small.mindspore_step(x, y, "fp16"),
             "O2 cell, called as a Cell": o2_cell(x, y),
             "pipe's train_step": ab_small.pipe_step("GPU", x, y, "fp16")[0]}
    print_against_first(in_turn(steps, args.steps), 28)


if __name__ == "__main__":
    cli.run(main)
