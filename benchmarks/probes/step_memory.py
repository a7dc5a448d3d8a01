"""Where the large MLP's peak device memory goes (16 x 8192, B=1024, fp32, one GPU): pipe's
step against MindSpore's, the allocator read after each phase.

    python benchmarks/probes/step_memory.py --impl mindspore|pipe|pipe-weights-first [--no-defer-wgrad]

`pipe` builds the engine on a zero-initialized model and then gives it random weights, as
benchmarks/benchmark.py does; `pipe-weights-first` gives the weights before the engine is
built, as MindSpore's step gets them. Each phase prints the bytes allocated now and the
most allocated so far, in GiB."""
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmark import build_model, own_random_weights  # noqa: E402
from builtin_pipeline import builtin_train_step  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, add_speed_flags, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

L, H, B = 16, 8192, 1024


def report(phase):
    if ms.get_context("device_target") != "GPU":
        print(phase, flush=True)
        return
    print(f"{phase:<28} now {ms.runtime.memory_allocated() / 2**30:6.2f} GiB, "
          f"peak {ms.runtime.max_memory_allocated() / 2**30:6.2f} GiB", flush=True)


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["mindspore", "pipe", "pipe-weights-first"], required=True)
    p.add_argument("--hidden", type=int, default=H, help="(smaller: a CPU check of the script)")
    add_speed_flags(p)
    args = p.parse_args(argv)
    use_device("GPU" if args.hidden == H else "CPU")
    hidden = args.hidden
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((B, hidden)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, B).astype(np.int32))
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    ms.set_context(mode=ms.GRAPH_MODE if args.impl == "mindspore" else ms.PYNATIVE_MODE)
    model = build_model(L, hidden, hidden, init="zeros")
    report("model built")
    if args.impl != "pipe":
        own_random_weights(model, 0, L + 1, seed=0)
        report("weights set")
    if args.impl == "mindspore":
        step = builtin_train_step(model, loss_fn, nn.SGD(model.trainable_params(), learning_rate=1e-3),
                                  1, 1, [(0, len(model))])
        run = lambda: step(x, y).asnumpy()          # noqa: E731
    else:
        config = PipelineConfig(device=ms.get_context("device_target"), batch_size=B, defer_wgrad=args.defer_wgrad,
                                one_graph=args.one_graph)
        engine = PipelineEngine(model, loss_fn, lambda ps: nn.SGD(ps, learning_rate=1e-3), config)
        report("engine built")
        if args.impl == "pipe":
            own_random_weights(model, 0, len(model), seed=0)
            report("weights set")
        run = lambda: engine.train_step(x, y)        # noqa: E731
    run()
    report("first step")
    for _ in range(3):
        run()
    report("four steps")


if __name__ == "__main__":
    cli.run(main)
