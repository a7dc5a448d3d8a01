"""Why one graph per step ran slower than the per-action loop on the large MLP (fp32, 2 GPUs:
110 against 85 ms): the same step, timed with one thing changed at a time.

    msrun --worker_num=2 --local_worker_num=2 --join=True benchmarks/probes/one_graph_large.py
    python benchmarks/probes/one_graph_large.py --stages 1 --schedule 1f1b     # no messages

Variants, one engine after another on one wire: the loop with W deferred (what pipe picks
there); one graph with W deferred and the optimizer inside the graph (what one_graph does
with one replica); the same with the optimizer outside it; one graph with W per
micro-batch. Rank 0 prints each one's median step over --repeats windows; with
--device-trace DIR every rank then traces 5 more steps of it on the GPU and prints what
the device did (benchmarks/probes/device_trace.py).
"""
import gc
import os
import statistics
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmark import build_model, own_random_weights, timed  # noqa: E402
from device_trace import summary, trace  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, positive_int, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

TRACED = 5          # steps traced per variant with --device-trace
VARIANTS = {  # name: (one_graph, defer_wgrad, optimizer inside the graph)
    "loop, W*": (False, True, False),
    "one graph, W*, update in graph": (True, True, True),
    "one graph, W*, update outside": (True, True, False),
    "one graph, W per micro-batch": (True, False, True),
}


def run(args, device, wire, x, y, one_graph, defer_wgrad, update_inside):
    """(engine, windows) of one variant."""
    config = PipelineConfig(stages=args.stages, micro_batches=args.micro_batches,
                            batch_size=args.batch_size, schedule=args.schedule, device=device,
                            partition="parameters", defer_wgrad=defer_wgrad, one_graph=one_graph)
    model = build_model(args.layers, args.hidden, args.hidden, init="zeros")
    engine = PipelineEngine(model, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                            lambda ps: nn.SGD(ps, learning_rate=1e-3), config, wire)
    for first, last in engine.layout.bounds:
        own_random_weights(model, first, last, seed=0)
    engine.update_in_graph = engine.update_in_graph and update_inside
    return engine, timed(lambda: engine.train_step(x, y), args)


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--stages", type=positive_int, default=2)
    p.add_argument("--schedule", default="zb-v")
    p.add_argument("--layers", type=positive_int, default=16)
    p.add_argument("--hidden", type=positive_int, default=8192)
    p.add_argument("--batch-size", type=positive_int, default=1024)
    p.add_argument("--micro-batches", type=positive_int, default=8)
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--warmup", type=positive_int, default=3)
    p.add_argument("--device-trace", metavar="DIR", help="trace each variant's kernels (GPU)")
    args = p.parse_args(argv)
    device = use_device("auto")
    if args.device_trace and device != "GPU":
        p.error("--device-trace needs a GPU (it records CUDA kernels)")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((args.batch_size, args.hidden)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, args.batch_size).astype(np.int32))
    wire = None
    for name, variant in VARIANTS.items():
        engine, windows = run(args, device, wire, x, y, *variant)
        wire = engine.wire
        if wire.rank == 0:
            print(f"{name:34s} {statistics.median(windows) * 1e3:9.2f} ms  "
                  f"(windows {', '.join(f'{w * 1e3:.2f}' for w in windows)})", flush=True)
        if args.device_trace:
            where = os.path.join(args.device_trace, "".join(c if c.isalnum() else "-" for c in name),
                                 f"rank{wire.rank}")
            trace(lambda: engine.train_step(x, y), TRACED, where)
            print("\n".join(f"rank {wire.rank}, {name}: {line}" for line in summary(where, TRACED)),
                  flush=True)
        del engine
        gc.collect()


if __name__ == "__main__":
    cli.run(main)
