"""What joining M micro-batches' rows costs on the GPU, by the operator that joins them.

    python benchmarks/probes/join_cost.py [--calls 200]

A deferred W joins its micro-batches' rows (pipe/split_backward.py: rows_of) with one
Concat per tensor; traced on the GPT at M=4 in fp16 those took 9.8 ms of a step, the
bytes moved at ~0.6 TB/s (benchmarks/log.md section 41). MindSpore's GPU Concat copies
one element per thread, finding its input by a loop and integer divisions. This times, at
the GPT's shapes (M=4 micro-batches of 4 x 512 rows; widths 768, 2304, 3072), each way
of writing the same join: Concat, Stack then a reshape, ParallelConcat of the flattened
tensors, each under one `ms.jit`, called back to back, the device's queue drained at
the end; and an elementwise kernel over the joined bytes for the device's copy speed.
Each way's result is checked equal to Concat's.
"""
import os
import sys
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import ops  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 3)[0])
from pipe import cli  # noqa: E402
from pipe.cli import Parser, positive_int, use_device  # noqa: E402

PARALLEL = ops.ParallelConcat()


@ms.jit
def concat(a, b, c, d):
    return ops.cat((a, b, c, d))


@ms.jit
def stack(a, b, c, d):
    return ops.stack((a, b, c, d)).reshape((-1,) + a.shape[1:])


@ms.jit
def parallel(a, b, c, d):
    flat = tuple(t.reshape((1, -1)) for t in (a, b, c, d))
    return PARALLEL(flat).reshape((-1,) + a.shape[1:])


@ms.jit
def negate(joined):
    return -joined


def per_call(fn, inputs, calls):
    for _ in range(3):
        fn(*inputs)
    ms.runtime.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    ms.runtime.synchronize()
    return (time.perf_counter() - start) / calls


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=positive_int, default=200)
    p.add_argument("--device", choices=["GPU", "CPU"], default="GPU")
    args = p.parse_args(argv)
    use_device(args.device)
    rng = np.random.default_rng(0)
    for dtype in (np.float16, np.float32):
        for width in (768, 2304, 3072):
            parts = [ms.Tensor(rng.standard_normal((4, 512, width)).astype(dtype)) for _ in range(4)]
            reference = concat(*parts).asnumpy()
            moved = 2 * reference.nbytes
            for name, fn, inputs in (("Concat", concat, parts), ("Stack", stack, parts),
                                     ("ParallelConcat", parallel, parts),
                                     ("elementwise (-x)", negate, [ms.Tensor(reference)])):
                seconds = per_call(fn, inputs, args.calls)
                same = name.startswith("element") or np.array_equal(fn(*inputs).asnumpy(), reference)
                print(f"{np.dtype(dtype).name:8s} width {width:5d}  {name:17s} {seconds * 1e6:8.1f} us  "
                      f"{moved / seconds / 1e12:5.2f} TB/s  equal to Concat: {same}", flush=True)
    return 0


if __name__ == "__main__":
    cli.run(main)
