"""Before the first step, neighbouring stages agree on the shapes that cross each boundary.

The walk follows the virtual stages in order: each learns its input's shape and dtype from
the previous one, runs its forward once on zeros (which also compiles it), and tells the
next its output's. Receives then never guess a shape. If a stage cannot take its input,
every rank learns it in one all-reduce and fails with the reason, before any real message.
"""
import mindspore as ms
import numpy as np
from mindspore import ops

__all__ = ["handshake"]

TAG = 32000                            # above every micro-batch message's tag
HEADER = 8                             # int32s: rank of the shape, dtype index, dims...
DTYPES = [ms.float32, ms.float16, ms.bfloat16, ms.float64, ms.int32, ms.int64]


def write_header(spec):
    """(shape, dtype) as a fixed-size int32 array; None (an upstream failure) as -1s."""
    header = np.full(HEADER, -1, np.int32)
    if spec is not None:
        shape, dtype = spec
        header[:2 + len(shape)] = [len(shape), DTYPES.index(dtype), *shape]
    return header


def read_header(header):
    if header[0] < 0:
        return None
    return tuple(int(d) for d in header[2:2 + header[0]]), DTYPES[int(header[1])]


def _probe(chunk, stage, spec_in, labels, bounds, previous):
    """Run `stage` on zeros of `spec_in`: its output spec, or an error message."""
    try:
        return stage.probe(ops.zeros(*spec_in), labels), ""
    except (ValueError, TypeError, RuntimeError) as e:
        first = bounds[0]
        return None, (f"stage {chunk} cannot take the activation of shape {spec_in[0]} "
                      f"{spec_in[1]} that stage {previous} sends across the boundary between "
                      f"layers {first - 1} and {first}: {str(e).strip().splitlines()[0]}")


def handshake(wire, schedule, ranks, me, stages, bounds, x, labels, world):
    """Returns ({virtual stage: (shape, dtype)} for this rank's inputs and outputs, the
    model's output spec). `stages[c]` and `bounds[c]` belong to this rank's chunk c."""
    V, specs, error = schedule.virtual_stages, {}, ""
    spec_out = None
    for chunk, stage in enumerate(stages):
        vs = schedule.virtual_stage(me, chunk)
        spec_in = (tuple(x.shape), x.dtype) if vs == 0 else read_header(
            wire.recv((HEADER,), ms.int32, ranks[schedule.rank_of(vs - 1)], TAG).asnumpy())
        if spec_in is None:
            error = error or f"stage {vs - 1} or one before it failed its shape check"
        spec_out = None
        if not error:
            spec_out, error = _probe(vs, stage, spec_in, labels, bounds[chunk], vs - 1)
        specs[vs], specs[vs + 1] = spec_in, spec_out
        if vs < V - 1:
            wire.send(ms.Tensor(write_header(None if error else spec_out)),
                      ranks[schedule.rank_of(vs + 1)], TAG)
    report = np.zeros(world + HEADER, np.int32)      # who failed; the model's output spec
    report[wire.rank] = bool(error)
    if stages[-1].is_last and ranks[0] == 0 and not error:
        report[world:] = write_header(spec_out) + 1  # +1: the -1 padding sums to 0
    report = wire.all_reduce(ms.Tensor(report), tuple(range(world))).asnumpy()
    if report[:world].any():
        raise RuntimeError(error or f"the shape check failed on rank(s) "
                           f"{np.flatnonzero(report[:world]).tolist()}: see their messages")
    return specs, read_header(report[world:] - 1)
