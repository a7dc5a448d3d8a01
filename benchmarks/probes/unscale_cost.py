"""What dividing fp16's gradients by the loss scale and checking them costs on a GPU, by
MindSpore operator: the large MLP's gradients (16 x 8192 x 8192 float32, 4.3 GB), each way
compiled alone and timed (median of 10 calls).

    python benchmarks/probes/unscale_cost.py

fp16_trace.py found the unscale (a Mul by a 0-d tensor: MindSpore's scalar kernel) taking
13 ms of the large MLP's 48 ms step, and IsFinite 3.6 ms, where a cast of the same
gradients takes 4 ms.
"""
import os
import statistics
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
from mindspore import ops  # noqa: E402
from mindspore.ops.auto_generate import muls as muls_op  # noqa: E402

LAYERS, WIDTH = 16, 8192


def wait(out):
    """Read one element of the last output: its copy to the host waits for the graph."""
    while isinstance(out, tuple):
        out = out[-1]
    return out.reshape(-1)[0].asnumpy()


def timed(fn, *args):
    wait(fn(*args))
    times = []
    for _ in range(10):
        start = time.perf_counter()
        wait(fn(*args))
        times.append(time.perf_counter() - start)
    out = None
    return statistics.median(times) * 1e3


@ms.jit
def cast_up(halves):
    return tuple(h.astype(ms.float32) for h in halves)


@ms.jit
def mul_scalar(grads, inverse):
    return tuple(g * inverse for g in grads)


@ms.jit
def mul_one(grads, inverse):          # a (1,) tensor: the broadcast kernel
    return tuple(g * inverse for g in grads)


@ms.jit
def mul_constant(grads):
    return tuple(g * (1.0 / 65536) for g in grads)


@ms.jit
def muls(grads):
    return tuple(muls_op(g, 1.0 / 65536) for g in grads)


@ms.jit
def cast_then_mul(halves, inverse):   # what fp16's weight gradient and unscale are together
    return tuple(h.astype(ms.float32) * inverse for h in halves)


@ms.jit
def finite_each(grads):
    return ops.stack([ops.isfinite(g).all() for g in grads]).all()


@ms.jit
def finite_by_sum(grads):             # a float32 sum of fp16-born values is finite iff all are
    return ops.stack([ops.isfinite(g.sum()) for g in grads]).all()


@ms.jit
def finite_half(halves):
    return ops.stack([ops.isfinite(h).all() for h in halves]).all()


@ms.jit
def unscale_now(grads, inverse):       # pipe.precision.Unscale's body
    unscaled, finite = (), ops.ones((), ms.bool_)
    for g in grads:
        unscaled = unscaled + (g * inverse,)
        finite = ops.logical_and(finite, ops.isfinite(g).all())
    return unscaled, finite


def main():
    ms.set_device("GPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    halves = tuple(ops.ones((WIDTH, WIDTH), ms.float16) for _ in range(LAYERS))
    grads = cast_up(halves)
    inverse, one = ms.Tensor(1.0 / 65536, ms.float32), ms.Tensor([1.0 / 65536], ms.float32)
    ways = {"cast float16 -> float32": (cast_up, halves),
            "x 0-d tensor (pipe's unscale)": (mul_scalar, grads, inverse),
            "x (1,) tensor": (mul_one, grads, one),
            "x Python constant": (mul_constant, grads),
            "ops.muls": (muls, grads),
            "cast, then x 0-d tensor": (cast_then_mul, halves, inverse),
            "isfinite(g).all() each": (finite_each, grads),
            "isfinite(g.sum()) each": (finite_by_sum, grads),
            "isfinite(float16 g).all() each": (finite_half, halves),
            "pipe's Unscale (x 0-d, isfinite.all)": (unscale_now, grads, inverse)}
    for name, (fn, *args) in ways.items():
        try:
            print(f"{name:40s} {timed(fn, *args):8.2f} ms", flush=True)
        except Exception as e:            # (an operator this build lacks on GPU)
            print(f"{name:40s} failed: {str(e).splitlines()[0][:100]}", flush=True)


if __name__ == "__main__":
    main()
