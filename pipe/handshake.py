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


def _expected_features(stage):
    """What the stage's first layer takes, if it says (nn.Dense does): for the message."""
    return getattr(stage.layers[0], "in_channels", -1)


def _mismatch(vs, spec, expects, bounds):
    first = bounds[vs][0]
    wanted = f"; its first layer expects {expects} features" if expects > 0 else ""
    return (f"stage {vs} cannot take the activation of shape {spec[0]} {spec[1]} that stage "
            f"{vs - 1} sends across the boundary between layers {first - 1} and {first}{wanted}. "
            f"Fix the model so that layer {first - 1}'s output fits layer {first}'s input")


def handshake(wire, schedule, ranks, me, stages, bounds, x, labels, world):
    """Returns ({virtual stage: (shape, dtype)} for this rank's inputs and outputs, the
    model's output spec). `stages[c]` is this rank's chunk c; `bounds[vs]` are the layers
    of every virtual stage."""
    V, specs, failure = schedule.virtual_stages, {}, None
    spec_out = None
    for chunk, stage in enumerate(stages):
        vs = schedule.virtual_stage(me, chunk)
        spec_in = (tuple(x.shape), x.dtype) if vs == 0 else read_header(
            wire.recv((HEADER,), ms.int32, ranks[schedule.rank_of(vs - 1)], TAG).asnumpy())
        spec_out = None
        if spec_in is not None and failure is None:
            try:
                spec_out = stage.probe(ops.zeros(*spec_in), labels)
            except (ValueError, TypeError, RuntimeError):
                failure = (vs, spec_in, _expected_features(stage))
        specs[vs], specs[vs + 1] = spec_in, spec_out
        if vs < V - 1:
            wire.send(ms.Tensor(write_header(spec_out)), ranks[schedule.rank_of(vs + 1)], TAG)
    # One all-reduce: every rank's failure (stage, shape it got, what it expects), and the
    # model's output spec for predict. Rows are summed, so each rank fills only its own.
    rows = np.zeros((world + 1, 3 + HEADER), np.int32)
    if failure is not None:
        vs, spec, expects = failure
        rows[wire.rank] = [1, vs, expects, *(write_header(spec) + 1)]   # +1: -1 pads sum to 0
    if stages[-1].is_last and ranks[0] == 0 and spec_out is not None:
        rows[world, 3:] = write_header(spec_out) + 1
    rows = wire.all_reduce(ms.Tensor(rows), tuple(range(world))).asnumpy()
    failed = {(int(r[1]), int(r[2]), read_header(r[3:] - 1)) for r in rows[:world] if r[0]}
    if failed:
        raise RuntimeError("shape check failed before the first step: " + "; ".join(
            _mismatch(vs, spec, expects, bounds) for vs, expects, spec in sorted(failed)))
    return specs, read_header(rows[world, 3:] - 1)
