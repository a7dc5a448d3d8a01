"""What joining M micro-batches' rows costs on the GPU, by how the copy is written.

    python benchmarks/probes/concat_cost.py --trace DIR [--precision fp16]

A deferred W that joins its micro-batches' rows (pipe.split_backward.rows_of) copies every
row once. On one H200 the GPT's joined W spent 9.8 ms of an fp16 step in `Concat` kernels
for about 4.8 GB read and written (benchmarks/log.md section 41): about 0.5 TB/s, a tenth
of the device's bandwidth. This joins one GPT block's W inputs (each product's input and
output gradient, M=4 micro-batches of 4 x 512 rows) several ways inside one compiled
function, traces each (device_trace.py: needs libcupti.so on LD_LIBRARY_PATH) and prints
the kernels' time and the bandwidth it amounts to; beside them an elementwise copy of the
same bytes, the bound.
"""
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import ops  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from device_trace import kernels, steps_of, trace  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser  # noqa: E402

M, ROWS, T = 4, 4, 512
WIDTHS = (768, 2304, 768, 768, 768, 3072, 3072, 768)    # qkv, proj, fc, fc2: input, output gradient


def joined_3d(parts):
    return ops.cat(parts)


def joined_flat(parts):
    flat = ()
    for p in parts:
        flat = flat + (p.reshape(-1),)
    return ops.cat(flat).reshape((-1,) + parts[0].shape[1:])


def joined_2d(parts):
    rows = ()
    for p in parts:
        rows = rows + (p.reshape(-1, p.shape[-1]),)
    return ops.cat(rows)


def joined_stack(parts):
    return ops.stack(parts).reshape((-1,) + parts[0].shape[1:])


def copied(parts):
    """The bound: one elementwise kernel writing the joined size from a tensor of it."""
    return ops.neg(parts[0])


WAYS = {"ops.cat of (b, T, C) tensors": joined_3d, "ops.cat of flat vectors": joined_flat,
        "ops.cat of 2-D rows": joined_2d, "ops.stack": joined_stack,
        "elementwise copy of the joined size": copied}


def block_step(way, dtype):
    """A step joining one block's W inputs the way `way` does, waiting for its results."""
    rng = np.random.default_rng(0)
    groups = []
    for width in WIDTHS:
        shape = (M * ROWS, T, width) if way is copied else (ROWS, T, width)
        count = 1 if way is copied else M
        groups.append(tuple(ms.Tensor(rng.standard_normal(shape), dtype) for _ in range(count)))

    @ms.jit
    def join(groups):
        out = ()
        for parts in groups:
            out = out + (way(parts),)
        return out

    def step():
        out = join(tuple(groups))
        ms.runtime.synchronize()
        return out
    return step


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp16")
    p.add_argument("--trace", metavar="DIR", required=True)
    args = p.parse_args(argv)
    ms.set_context(device_target="GPU", mode=ms.PYNATIVE_MODE)
    dtype = ms.float16 if args.precision == "fp16" else ms.float32
    moved = 2 * M * ROWS * T * sum(WIDTHS) * (2 if dtype == ms.float16 else 4)   # read + written
    print(f"one GPT block's W inputs joined, M={M}, {args.precision}: {moved / 1e9:.2f} GB moved")
    for name, way in WAYS.items():
        step = block_step(way, dtype)
        for _ in range(3):
            step()
        directory = os.path.join(args.trace, way.__name__)
        trace(step, 3, directory)
        found = steps_of(kernels(directory), 3)[1]
        spent = sum(d for _, d, _ in found) / 1e3
        names = sorted({n[:40] for _, _, n in found})
        print(f"  {name:38s} {spent:8.1f} us  {moved / spent / 1e6:5.2f} TB/s  "
              f"({len(found)} kernels: {', '.join(names)})", flush=True)
    return 0


if __name__ == "__main__":
    cli.run(main)
