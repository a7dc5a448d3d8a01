"""Before the first step, neighbouring stages agree on the shapes that cross each boundary.

The walk follows the virtual stages in order: each learns its input's shape and dtype from
the previous one, runs its forward once on zeros (which also compiles it), and tells the
next its output's. Receives then never guess a shape. If a stage cannot take its input,
every rank learns it in one all-reduce and fails with the reason, before any real message.
"""
import mindspore as ms
import numpy as np
from mindspore import ops

from pipe.comm import WIRE_DTYPES, PointToPoint

__all__ = ["connect_stages", "handshake", "check_input"]

HEADER = 8                             # int32s: rank of the shape, dtype index, dims...
DTYPES = list(WIRE_DTYPES)             # a dtype travels in the header as its index here
FLOATS = (ms.float32, ms.float16, ms.bfloat16, ms.float64)
KINDS = ("shape", "dtype", "wire")     # what a stage's check can find wrong


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


def _first_weight(stage):
    """The first float weight the stage's input meets, and its layer: what sets the dtype
    (and, for nn.Dense, the features) the stage takes."""
    for layer in stage.layers:
        for p in layer.trainable_params():
            return layer, p
    return None, None


def check_input(stage, spec, carried):
    """Why `stage` cannot take an input of (shape, dtype) `spec`, found before running it:
    (kind, expected) with kind "dtype" or "wire", or None. `carried`: the dtypes the wire
    can bring it (None for the input batch, which does not travel)."""
    shape, dtype = spec
    if carried is not None and dtype not in carried:
        return "wire", DTYPES.index(dtype)
    layer, weight = _first_weight(stage)
    if weight is not None and dtype in FLOATS and dtype != weight.dtype:
        return "dtype", DTYPES.index(weight.dtype)
    return None


def _failure_text(vs, kind, expected, spec, bounds):
    first = bounds[vs][0]
    coming = ("the input batch" if vs == 0 else
              f"stage {vs - 1}'s output (the boundary between layers {first - 1} and {first})")
    got = f"shape {spec[0]} {spec[1]}"
    if kind == "wire":
        return (f"stage {vs} would receive {coming} as {spec[1]}, which the CPU wire (numpy) "
                "cannot carry; use float32 or float16 activations on CPU")
    if kind == "dtype":
        source = "the input batch" if vs == 0 else f"the output of layer {first - 1}"
        return (f"dtype mismatch: stage {vs} receives {coming} as {spec[1]}, but the first "
                f"weights it meets are {DTYPES[expected]}; cast {source} to {DTYPES[expected]}")
    wanted = f"; its first layer expects {expected} features" if expected > 0 else ""
    fix = (f"Fix the model so that layer {first - 1}'s output fits layer {first}'s input" if vs
           else f"Fix the input batch or layer {first}")
    return f"stage {vs} cannot take {coming}, of {got}{wanted}. {fix}"


def handshake(wire, schedule, ranks, me, stages, bounds, x, labels, world):
    """Returns ({virtual stage: (shape, dtype)} for this rank's inputs and outputs, the
    model's output spec). `stages[c]` is this rank's chunk c; `bounds[vs]` are the layers
    of every virtual stage."""
    V, specs, failure = schedule.virtual_stages, {}, None
    spec_out = None
    for chunk, stage in enumerate(stages):
        vs = schedule.virtual_stage(me, chunk)
        if vs == 0:
            spec_in = (tuple(x.shape), x.dtype)
        elif schedule.rank_of(vs - 1) == me:          # the turn of a V: this rank's own output
            spec_in = specs[vs]
        else:
            spec_in = read_header(wire.recv((HEADER,), ms.int32, ranks[schedule.rank_of(vs - 1)],
                                            schedule.free_tag).asnumpy())
        spec_out = None
        if spec_in is not None and failure is None:
            problem = check_input(stage, spec_in, wire.dtypes if vs else None)
            if problem is None:
                try:
                    spec_out = stage.probe(ops.zeros(*spec_in), labels)
                except (ValueError, TypeError, RuntimeError):
                    layer, _ = _first_weight(stage)
                    problem = "shape", getattr(layer, "in_channels", -1)
            if problem is not None:
                failure = (vs, *problem, spec_in)
        specs[vs], specs[vs + 1] = spec_in, spec_out
        if vs < V - 1 and schedule.rank_of(vs + 1) != me:
            wire.send(ms.Tensor(write_header(spec_out)), ranks[schedule.rank_of(vs + 1)],
                      schedule.free_tag)
    # One all-reduce: every rank's failure (stage, what went wrong, what it expects, what it
    # got), and the model's output spec for predict. Rows are summed, so each rank fills
    # only its own.
    rows = np.zeros((world + 1, 3 + HEADER), np.int32)
    if failure is not None:
        vs, kind, expected, spec = failure
        rows[wire.rank] = [KINDS.index(kind) + 1, vs, expected, *(write_header(spec) + 1)]  # +1: -1 pads sum to 0
    if stages[-1].is_last and ranks[0] == 0 and spec_out is not None:
        rows[world, 3:] = write_header(spec_out) + 1
    rows = wire.all_reduce(ms.Tensor(rows), tuple(range(world))).asnumpy()
    failed = sorted({(int(r[1]), KINDS[r[0] - 1], int(r[2]), read_header(r[3:] - 1))
                     for r in rows[:world] if r[0]})
    if failed:
        raise RuntimeError("check before the first step failed: " + "; ".join(
            _failure_text(vs, kind, expected, spec, bounds) for vs, kind, expected, spec in failed))
    return specs, read_header(rows[world, 3:] - 1)


def connect_stages(wire, layout, x, labels):
    """This rank's pipeline messages (a PointToPoint with every boundary's shape), agreed
    with its neighbours on the first micro-batch `x`, and the model's output spec."""
    ranks = layout.topo.pipeline_ranks(layout.replica)
    shapes, output_spec = handshake(wire, layout.schedule, ranks, layout.stage, layout.chunks,
                                    layout.all_bounds, x, labels, layout.topo.world_size)
    return PointToPoint(wire, ranks, shapes), output_spec
