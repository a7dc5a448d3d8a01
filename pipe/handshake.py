"""Before the first step, neighbouring stages agree on the shapes that cross each boundary.

The walk follows the virtual stages in order: each learns its input's shape and dtype from
the previous one, runs its forward on that input (which also compiles it), and tells the
next its output's. Receives then never guess a shape. A training forward runs twice and
must give the same result: a layer that draws its own random numbers is refused here,
since the backward would run it again and draw others.

Whatever fails on any rank, of any exception type, every rank learns it in one all-reduce
and fails before any real message. What is wrong with a boundary (a shape, a dtype) reaches
every rank in full; the model's own error (a layer's exception, the loss's, a compile
failure, a random layer) is told in full by the rank where it happened, with the layer,
and the others say where to look.
"""
import glob
import os
import time
from typing import NamedTuple

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.chunk import RandomLayer
from pipe.comm import WIRE_DTYPES, PointToPoint
from pipe.watchdog import PeerFailed, first_line

__all__ = ["connect_stages", "handshake", "check_input", "agreed"]

HEADER = 8                             # int32s: rank of the shape, dtype index, dims...
DTYPES = list(WIRE_DTYPES)             # a dtype travels in the header as its index here
FLOATS = (ms.float32, ms.float16, ms.bfloat16, ms.float64)
KINDS = ("shape", "dtype", "wire", "model")   # what a stage's check can find wrong
TOLD_IN_FULL = ("shape", "dtype", "wire")     # ... and what every rank can say in full


class Failure(NamedTuple):
    """What went wrong on this rank's stage: `kind` (one of KINDS), `expected` (a number
    every rank can word: a dtype's index, a feature count), `text` (the model's own error,
    told by this rank alone) and the exception behind it."""
    vs: int
    spec: tuple
    kind: str
    expected: int
    text: str
    error: object


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
    """The first leaf layer with weights, by index, and its first weight: what sets the
    dtype (and, for an nn.Dense first, the features) the stage takes."""
    for k, layer in enumerate(stage.layers):
        for p in layer.trainable_params():
            return k, p
    return None, None


def check_input(spec, carried):
    """Whether the wire can bring a stage its input of (shape, dtype) `spec`: ("wire",
    dtype index) if not, else None. `carried`: the dtypes the wire carries (None for the
    input batch, which does not travel)."""
    if carried is not None and spec[1] not in carried:
        return "wire", DTYPES.index(spec[1])
    return None


def explain(stage, spec, labels, error):
    """(kind, expected, what) for the `error` that a stage's forward raised on an input of
    `spec`: the boundary's dtype or shape when the stage's first layer with weights cannot
    take the input; else the model's own error, with the piece of the stage that raised it
    (run again eagerly, piece by piece)."""
    if isinstance(error, RandomLayer):
        return "model", 0, str(error)
    found = stage.locate_failure(ops.ones(*spec), labels)
    if found is None:
        return "model", 0, ("compiling its forward failed (each layer ran alone): "
                            f"{first_line(error)}")
    k, where, cause = found
    first, weight = _first_weight(stage)
    shape, dtype = spec
    if k == first and dtype in FLOATS and dtype != weight.dtype:
        return "dtype", DTYPES.index(weight.dtype), ""
    layer = stage.layers[k] if k < len(stage.layers) else None
    if k == 0 and isinstance(layer, nn.Dense) and shape[-1] != layer.in_channels:
        return "shape", layer.in_channels, ""
    return "model", 0, f"{where}, raised {first_line(cause)}"


def _compile_report(since):
    """MindSpore's report of a failed compile (analyze_fail.ir), if one was written since
    `since` (pipe.engine points MindSpore's dumps away from the working directory)."""
    where = os.environ.get("MS_OM_PATH", ".")
    found = [p for p in glob.glob(os.path.join(where, "rank_*", "om", "analyze_fail.ir"))
             if os.path.getmtime(p) >= since]
    return f" (MindSpore's compile report: {found[0]})" if found else ""


def _coming(vs, bounds):
    first = bounds[vs][0]
    return ("the input batch" if vs == 0 else
            f"stage {vs - 1}'s output (the boundary between layers {first - 1} and {first})")


def _failure_text(vs, kind, expected, spec, bounds):
    """A boundary's problem, in words every rank can give (from the all-reduced numbers)."""
    first, coming = bounds[vs][0], _coming(vs, bounds)
    if kind == "wire":
        return (f"stage {vs} would receive {coming} as {spec[1]}, which the CPU wire (numpy) "
                "cannot carry; use float32 or float16 activations on CPU")
    if kind == "dtype":
        source = "the input batch" if vs == 0 else f"the output of layer {first - 1}"
        return (f"dtype mismatch: stage {vs} receives {coming} as {spec[1]}, but the first "
                f"weights it meets are {DTYPES[expected]}; cast {source} to {DTYPES[expected]}")
    fix = (f"Fix the model so that layer {first - 1}'s output fits layer {first}'s input" if vs
           else f"Fix the input batch or layer {first}")
    return (f"stage {vs} cannot take {coming}, of shape {spec[0]} {spec[1]}; its first layer "
            f"expects {expected} features. {fix}")


def _check_stage(stage, vs, spec, labels, bounds, carried, training):
    """(the stage's output spec, None), or (None, its Failure) when it cannot run on an
    input of `spec`."""
    problem = check_input(spec, carried)
    if problem is not None:
        return None, Failure(vs, spec, *problem, "", None)
    since = time.time()
    try:
        return stage.probe(ops.ones(*spec), labels, training), None
    except Exception as error:           # the user's model: any exception is its error
        kind, expected, what = explain(stage, spec, labels if training else None, error)
        first, last = bounds[vs]
        layers = f"layer {first}" if last - first == 1 else f"layers {first} to {last - 1}"
        text = (f"stage {vs} ({layers}) failed on {_coming(vs, bounds)}, of shape {spec[0]} "
                f"{spec[1]}: {what}{_compile_report(since)}")
        return None, Failure(vs, spec, kind, expected, text, error)


def handshake(wire, schedule, ranks, me, stages, bounds, x, labels, world, training=True):
    """Returns ({virtual stage: (shape, dtype)} for this rank's inputs and outputs, the
    model's output spec). `stages[c]` is this rank's chunk c; `bounds[vs]` are the layers
    of every virtual stage. `training` False (predict) runs the forward in eval mode, with
    no loss."""
    V, specs, failure = schedule.virtual_stages, {}, None
    spec_out = None
    for chunk, stage in enumerate(stages):
        vs = schedule.virtual_stage(me, chunk)
        if vs == 0:
            spec_in = (tuple(x.shape), x.dtype)
        elif schedule.holds(me, vs - 1):              # the turn of a V: this rank's own output
            spec_in = specs[vs]
        else:
            spec_in = read_header(wire.recv((HEADER,), ms.int32, ranks[schedule.rank_of(vs - 1)],
                                            schedule.free_tag).asnumpy())
        spec_out = None
        if spec_in is not None and failure is None:
            spec_out, failure = _check_stage(stage, vs, spec_in, labels, bounds,
                                             wire.dtypes if vs else None, training)
        specs[vs], specs[vs + 1] = spec_in, spec_out
        if vs < V - 1 and not schedule.holds(me, vs + 1):
            wire.send(ms.Tensor(write_header(spec_out)), ranks[schedule.rank_of(vs + 1)],
                      schedule.free_tag)
    # One all-reduce: every rank's failure (stage, what went wrong, what it expects, what it
    # got), and the model's output spec for predict. Rows are summed, so each rank fills
    # only its own.
    rows = np.zeros((world + 1, 3 + HEADER), np.int32)
    if failure is not None:                     # +1: -1 pads sum to 0
        rows[wire.rank] = [KINDS.index(failure.kind) + 1, failure.vs, failure.expected,
                           *(write_header(failure.spec) + 1)]
    if stages[-1].is_last and ranks[0] == 0 and spec_out is not None:
        rows[world, 3:] = write_header(spec_out) + 1
    rows = wire.all_reduce(ms.Tensor(rows), tuple(range(world))).asnumpy()
    _raise_failures(rows[:world], failure, bounds)
    return specs, read_header(rows[world, 3:] - 1)


def _raise_failures(rows, mine, bounds):
    """Fail on every rank if any failed. A boundary's problem is told in full everywhere;
    the model's own error in full where it happened, and elsewhere as a line naming that
    rank. `mine`: this rank's Failure, or None."""
    failed = sorted({(int(r[1]), KINDS[r[0] - 1], int(r[2]), read_header(r[3:] - 1), rank)
                     for rank, r in enumerate(rows) if r[0]})
    if not failed:
        return
    told = [_failure_text(vs, kind, expected, spec, bounds)
            for vs, kind, expected, spec, _ in failed if kind in TOLD_IN_FULL]
    error = mine.error if mine is not None else None
    if mine is not None and mine.kind == "model":
        told.append(mine.text)
    if told:
        raise RuntimeError("check before the first step failed: " + "; ".join(told)) from error
    vs, _, _, _, rank = failed[0]
    raise PeerFailed(f"the check before the first step failed on rank {rank} (stage {vs}): "
                     f"rank {rank}'s error says why")


def agreed(wire, work):
    """`work()` on every rank, and its result; if it raises on any rank, it fails on
    every rank before any of them waits on another: the rank where it happened raises its
    own error, the others a line that names that rank."""
    try:
        result, error = work(), None
    except Exception as e:               # any exception: a peer must not wait for this rank
        result, error = None, e
    failed = np.zeros(wire.size, np.int32)
    failed[wire.rank] = error is not None
    failed = wire.all_reduce(ms.Tensor(failed), tuple(range(wire.size))).asnumpy()
    if error is not None:
        raise error
    if failed.any():
        rank = int(np.argmax(failed))
        raise PeerFailed(f"rank {rank} failed while building its stages: rank {rank}'s error "
                         "says why")
    return result


def connect_stages(wire, layout, x, labels, training=True):
    """This rank's pipeline messages (a PointToPoint with every boundary's shape), agreed
    with its neighbours on the first micro-batch `x`, and the model's output spec."""
    ranks = layout.topo.pipeline_ranks(layout.replica)
    shapes, output_spec = handshake(wire, layout.schedule, ranks, layout.stage, layout.chunks,
                                    layout.all_bounds, x, labels, layout.topo.world_size,
                                    training)
    return PointToPoint(wire, ranks, shapes), output_spec
