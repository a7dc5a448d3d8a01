"""Where one rank's training step spends its host time: cProfile of `train_step`.

    python benchmarks/probes/profile_step.py GPU --micro-batches 4 --one-graph

The small MLP (8 x 1024) on one device, after 5 warm-up steps; prints the median step and
the functions that took the most time over 50 steps (`--steps`, `--rows`). `Tensor.asnumpy` is the host waiting
for the device (benchmarks/log.md, section 13).
"""
import cProfile
import os
import pstats
import statistics
import sys
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "mnist"))
from train import build_model  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, positive_int, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("device", choices=["CPU", "GPU", "Ascend"])
    p.add_argument("--micro-batches", type=positive_int, default=1)
    p.add_argument("--one-graph", action="store_true")
    p.add_argument("--steps", type=positive_int, default=50, help="steps profiled")
    p.add_argument("--rows", type=positive_int, default=12, help="functions printed")
    args = p.parse_args(argv)
    use_device(args.device)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    config = PipelineConfig(micro_batches=args.micro_batches, batch_size=64, device=args.device,
                            one_graph=args.one_graph)
    engine = PipelineEngine(build_model(8, 1024, 784), nn.SoftmaxCrossEntropyWithLogits(
        sparse=True, reduction="mean"), lambda ps: nn.SGD(ps, learning_rate=1e-3), config)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((64, 784)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, 64).astype(np.int32))
    times = []
    for i in range(35):
        start = time.perf_counter()
        engine.train_step(x, y)
        times.append(time.perf_counter() - start)
    print(f"median step {statistics.median(times[5:]) * 1e3:.2f} ms")
    profile = cProfile.Profile()
    profile.runcall(lambda: [engine.train_step(x, y) for _ in range(args.steps)])
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.rows)


if __name__ == "__main__":
    cli.run(main)
