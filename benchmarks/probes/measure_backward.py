"""Why a stage keeps every layer's input and differentiates layer by layer (pipe/core/chunk.py).

    python benchmarks/probes/measure_backward.py [--width 2048] [--batch 1024] [--layers 2]

Times, on one device, for a stack of Dense+ReLU layers (a backward alone ideally costs
two forwards: dX and dW are one matrix product each):
  forward                 the compiled forward alone
  backward, recompute     jit GradOperation of the whole stack from its input: it runs
                          the forward again inside the backward
  backward, per layer     pipe's choice: one compiled graph of layer-wise VJPs at the
                          inputs the forward saved
  PyNative vjp, F+B       ms.vjp: keeps the forward's closure, runs op by op
and checks that the two compiled backwards agree.
"""
import os
import sys
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pipe.cli import Parser, use_device  # noqa: E402
from pipe.partition import _LayerStep  # noqa: E402  (a cell's compiled forward + backward)
from pipe.core.chunk import Chunk  # noqa: E402


def best_ms(fn, repeat=5):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main():
    p = Parser()
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--device", choices=["CPU", "GPU"], default="CPU")
    args = p.parse_args()
    use_device(args.device)
    layers = [cell for _ in range(args.layers) for cell in (nn.Dense(args.width, args.width), nn.ReLU())]
    net = nn.SequentialCell(layers)
    x = ms.Tensor(np.random.randn(args.batch, args.width).astype(np.float32))
    dy = ms.Tensor(np.random.randn(args.batch, args.width).astype(np.float32))
    chunk = Chunk(layers, is_first=False)            # its own compiled forward and backward
    forward, backward, recompute = chunk.forward_cell, chunk.backward_cell, _LayerStep(net)
    _, saved = forward(x, chunk.no_labels, chunk.grad_scale, ())
    sync = lambda out: out[0].asnumpy()
    results = {
        "forward": best_ms(lambda: sync(forward(x, chunk.no_labels, chunk.grad_scale, ()))),
        "backward, recompute": best_ms(lambda: sync(recompute(x, dy)[0])),
        "backward, per layer": best_ms(lambda: sync(backward(dy, *saved))),
        "PyNative vjp, F+B": best_ms(lambda: sync(ms.vjp(net, x)[1](dy))),
    }
    print(f"{args.layers} x (Dense {args.width} + ReLU), batch {args.batch}, {args.device}:")
    for name, value in results.items():
        print(f"  {name:20s} {value:8.1f} ms   ({value / results['forward']:.2f} x forward)")
    dx_a, grads_a = backward(dy, *saved)
    (dx_b,), grads_b = recompute(x, dy)
    worst = max(float(np.abs(a.asnumpy() - b.asnumpy()).max()) for a, b in zip((dx_a, *grads_a), (dx_b, *grads_b)))
    print(f"  per-layer and recompute agree to {worst:.1e}")


if __name__ == "__main__":
    main()
