"""Before the first step, every stage's forward is checked on what will reach it.

`connect_stages` passes each boundary's (shape, dtype) from stage to stage and runs each
forward on it (`probe`: twice, which must agree, or a layer draws its own random numbers
that pipe's backward would draw again). One all-reduce (`StageCheck.agree`) then tells
every rank of every failure before any real message: a boundary's problem in full on every
rank, the model's own error in full where it happened and as a pointer elsewhere."""
import glob
import os
import time
from typing import NamedTuple

import mindspore as ms
import numpy as np
from mindspore import nn

from pipe.features.batchnorm import buffers_kept
from pipe.features.precision import computes_half
from pipe.features.token_loss import check_count, is_counted
from pipe.layers import arguments, variable
from pipe.ops.watchdog import PeerFailed, alike, first_line
from pipe.wire import (DTYPES, HEADER, Parts, PointToPoint, carrier, elements, example, read_header,
                       spec_of, write_header)

__all__ = ["connect_stages", "StageCheck", "RandomLayer", "check_input", "agreed", "probe",
           "describe_layer"]

FLOATS = (ms.float32, ms.float16, ms.bfloat16, ms.float64)
ONE = ms.Tensor(1.0, ms.float32)              # the loss gradient's scale a check runs with
KINDS = ("shape", "dtype", "wire", "model")   # what a stage's check can find wrong
TOLD_IN_FULL = ("shape", "dtype", "wire")     # ... and what every rank can say in full
HALF_HINT = (" (precision='fp16' casts each layer's inputs, not a Parameter its construct "
             "reads itself: cast it to the input's dtype there, `w.astype(x.dtype)`, as "
             "nn.Dense does)")


class RandomLayer(TypeError):
    """A layer draws random numbers inside: pipe's backward would run it again and draw others."""


class Failure(NamedTuple):
    """What went wrong on this rank's stage: `kind` (of KINDS), `expected` (a number every
    rank can word), `text` (the model's own error, told by this rank alone), the exception."""
    vs: int
    spec: tuple
    kind: str
    expected: int
    text: str
    error: object


def connect_stages(schedule, stage, wire, ranks, first_input, probe):
    """Agree on what crosses each boundary: in virtual-stage order a stage learns its input's
    spec (the batch's, or a header from the stage before), `probe`s its forward on it, and
    tells the next stage. Returns this rank's messages."""
    specs = {}
    for c in range(schedule.chunks_per_stage):
        vs = schedule.virtual_stage(stage, c)
        if vs == 0:
            specs[vs] = spec_of(first_input)
        elif not schedule.holds(stage, vs - 1):   # (held: this stage's own output)
            specs[vs] = read_header(wire.recv((HEADER,), ms.int32, ranks[schedule.stage_of(vs - 1)],
                                              schedule.free_tag).asnumpy())
        specs[vs + 1] = None if specs[vs] is None else probe(c, vs, specs[vs])
        if vs + 1 < schedule.virtual_stages and not schedule.holds(stage, vs + 1):
            wire.send(ms.Tensor(write_header(specs[vs + 1])), ranks[schedule.stage_of(vs + 1)],
                      schedule.free_tag)
    return PointToPoint(wire, ranks, specs)


# ---- one chunk's forward, run before the first step -----------------------------------
def probe(chunk, x, labels, training=True, runs=2):
    """Run the chunk's forward on `x` as a step will (compiling it), keeping nothing; returns
    its output's spec (the logits' on the last chunk) and whether the loss is (sum, count).
    A training forward runs `runs` times: if they differ, `RandomLayer` names the layer."""
    chunk.set_mode(training)
    if not training:
        return spec_of(chunk.infer(x)), False
    labels = chunk.labels(labels if chunk.is_last else None)    # (as a step calls it: one compile)
    with buffers_kept(chunk):
        masks = chunk.masks.learn(x)     # (keeping every unit)
        runs = [chunk.forward_cell(variable(x), labels, ONE, masks)[0] for _ in range(runs)]
    if not _same(runs[0], runs[-1]):
        raise RandomLayer(f"{_random_layer(chunk, x)} draws random numbers inside: two runs "
                          "of its forward on the same input differ, and pipe's backward "
                          "runs it again, drawing others; make each dropout an nn.Dropout "
                          "layer of its own (pipe draws its mask once per micro-batch)")
    if not chunk.is_last:
        return spec_of(runs[0]), False
    logits = spec_of(runs[0][1])          # (the loss gradient's: the logits' shape and dtype)
    counted = is_counted(chunk.loss_fn.loss_fn, logits, labels)
    if counted:
        check_count(chunk.loss_fn.loss_fn, logits, labels)
    return logits, counted


def _random_layer(chunk, x):
    """The first layer whose output differs between two eager runs on the same input."""
    with buffers_kept(chunk):
        for k, layer in enumerate(chunk.layers):
            y = layer(*arguments(x))
            if type(layer) is not nn.Dropout and not _same(y, layer(*arguments(x))):
                return describe_layer(chunk, k)
            x = y
    last = describe_layer(chunk, len(chunk.layers) - 1)
    return f"a layer of {describe_layer(chunk, 0)} to {last}"


def describe_layer(chunk, k):
    """Leaf layer k as the user knows it: its index in the whole model (with its place in
    a nested SequentialCell pipe split) and its class."""
    i, j = chunk.named[k]
    part = f".{j}" if sum(1 for n in chunk.named if n[0] == i) > 1 else ""
    return f"layer {i}{part} ({type(chunk.layers[k]).__name__})"


def locate_failure(chunk, x, labels):
    """Where the training forward fails on `x`, run eagerly piece by piece: (k, what, its
    exception), k = len(layers) for the loss; None if every piece runs alone."""
    chunk.set_mode(True)
    with buffers_kept(chunk):
        for k, layer in enumerate(chunk.layers):
            try:
                y = layer(*arguments(x))
            except Exception as error:       # the user's code: any exception
                return k, f"{describe_layer(chunk, k)}, given {_spec(x)}", error
            x = y
        if chunk.is_last and labels is not None:
            try:
                chunk.loss_fn(x, labels)
            except Exception as error:
                return len(chunk.layers), (f"loss_fn, given logits of {_spec(x)} and labels "
                                           f"of {_spec(labels)}"), error
    return None


def _spec(x):
    """What a piece was given, in words: `shape (4, 8) Float32`, or what it was instead."""
    if isinstance(x, ms.Tensor):
        return f"shape {tuple(x.shape)} {x.dtype}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} ({', '.join(map(_spec, x))})"
    return f"a {type(x).__name__}"


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [t for part in out for t in _flat(part)]
    return [out]


def _same(one, other):
    """Whether two runs' outputs are equal bit for bit (NaN equal to NaN)."""
    return all(np.array_equal(a.asnumpy(), b.asnumpy(), equal_nan=True)
               for a, b in zip(_flat(one), _flat(other)))


# ---- what went wrong, in words ---------------------------------------------------------
def _first_weight(chunk):
    """(index, first weight) of the first leaf layer with weights: what sets the dtype the
    stage takes."""
    for k, layer in enumerate(chunk.layers):
        for p in layer.trainable_params():
            return k, p
    return None, None


def is_half(chunk):
    """Whether the chunk computes in float16 (precision='fp16' cast its layers)."""
    return any(map(computes_half, chunk.layers))


def check_input(spec, carried):
    """("wire", element index) when the wire cannot carry an element of `spec`, else None
    (`carried` None: the input batch, which does not travel)."""
    for k, (_, dtype) in enumerate(elements(spec)):
        if carried is not None and carrier(dtype) not in carried:
            return "wire", k
    return None


def check_dtype(chunk, spec):
    """("dtype", the first weights' dtype index) when the chunk's first layer has weights of
    another float dtype than its input, found before a failed compile prints pages."""
    if isinstance(spec, Parts) or is_half(chunk):
        return None
    first, weight = _first_weight(chunk)
    if first == 0 and spec[1] in FLOATS and spec[1] != weight.dtype:
        return "dtype", DTYPES.index(weight.dtype)
    return None


def explain(chunk, spec, labels, error):
    """(kind, expected, what) for the `error` a stage's forward raised on `spec`: the
    boundary's dtype or shape when its first weighted layer cannot take the input, else the
    model's own error with the piece that raised it."""
    if isinstance(error, RandomLayer):
        return "model", 0, str(error)
    found = locate_failure(chunk, example(spec), labels)
    if found is None:
        return "model", 0, ("compiling its forward failed (each layer ran alone): "
                            f"{first_line(error)}{HALF_HINT if is_half(chunk) else ''}")
    k, where, cause = found
    if isinstance(spec, Parts):
        return "model", 0, f"{where}, raised {first_line(cause)}"
    first, weight = _first_weight(chunk)
    shape, dtype = spec
    if k == first and dtype in FLOATS and dtype != weight.dtype and not is_half(chunk):
        return "dtype", DTYPES.index(weight.dtype), ""
    layer = chunk.layers[k] if k < len(chunk.layers) else None
    if k == 0 and isinstance(layer, nn.Dense) and shape[-1] != layer.in_channels:
        return "shape", layer.in_channels, ""
    return "model", 0, f"{where}, raised {first_line(cause)}"


def _words(spec):
    """A spec in words: `shape (4, 8) Float32`, or a tuple of those."""
    if isinstance(spec, Parts):
        return "a tuple (" + ", ".join(map(_words, spec)) + ")"
    return f"shape {spec[0]} {spec[1]}"


def _compile_report(since):
    """MindSpore's report of a failed compile written since `since`, if any."""
    where = os.environ.get("MS_OM_PATH", ".")
    found = [p for p in glob.glob(os.path.join(where, "rank_*", "om", "analyze_fail.ir"))
             if os.path.getmtime(p) >= since]
    return f" (MindSpore's compile report: {found[0]})" if found else ""


def _stage(vs, bounds, stages):
    """"stage 2", or "virtual stage 2" when a stage holds several chunks."""
    return f"stage {vs}" if len(bounds) == stages else f"virtual stage {vs}"


def _coming(vs, bounds, stages):
    """What reaches virtual stage vs, in words."""
    first = bounds[vs][0]
    return ("the input batch" if vs == 0 else f"{_stage(vs - 1, bounds, stages)}'s output "
            f"(the boundary between layers {first - 1} and {first})")


def failure_text(vs, kind, expected, spec, bounds, stages, carried):
    """A boundary's problem in words every rank can give (from the all-reduced numbers)."""
    first, coming, stage = bounds[vs][0], _coming(vs, bounds, stages), _stage(vs, bounds, stages)
    if kind == "wire":
        dtype = elements(spec)[expected][1]
        element = f"element {expected} of " if isinstance(spec, Parts) else ""
        return (f"{stage} would receive {element}{coming} as {dtype}, which this wire does "
                f"not carry; make layer {first - 1} hand it on as one of "
                f"{', '.join(str(d) for d in DTYPES if carrier(d) in carried)}")
    if kind == "dtype":
        source = "the input batch" if vs == 0 else f"the output of layer {first - 1}"
        return (f"dtype mismatch: {stage} receives {coming} as {spec[1]}, but the first "
                f"weights it meets are {DTYPES[expected]}; cast {source} to {DTYPES[expected]}")
    fix = (f"Fix the model so that layer {first - 1}'s output fits layer {first}'s input" if vs
           else f"Fix the input batch or layer {first}")
    return (f"{stage} cannot take {coming}, of {_words(spec)}; its first layer "
            f"expects {expected} features. {fix}")


# ---- the check, on every rank ------------------------------------------------------------
class StageCheck:
    """`connect_stages`' probe, keeping this rank's first failure, and `agree`, which fails
    every rank if any failed. `bounds[vs]`: the layers of each virtual stage."""

    def __init__(self, chunks, bounds, stages, labels, carried, training=True, runs=2):
        self.chunks, self.bounds, self.stages, self.labels = chunks, bounds, stages, labels
        self.carried, self.training, self.runs = carried, training, runs
        self.failure, self.counted = None, False    # counted: the loss is (sum, count)

    def probe(self, c, vs, spec):
        """Chunk c's output spec on an input of `spec`, or None after a failure here."""
        if self.failure is not None:
            return None
        problem = (check_input(spec, self.carried if vs else None)
                   or check_dtype(self.chunks[c], spec))
        if problem is not None:
            self.failure = Failure(vs, spec, *problem, "", None)
            return None
        since, chunk = time.time(), self.chunks[c]
        try:
            out, counted = probe(chunk, example(spec), self.labels, self.training, self.runs)
            self.counted = self.counted or counted
            return out
        except Exception as error:           # the user's model: any exception is its error
            labels = self.labels if self.training else None
            kind, expected, what = explain(chunk, spec, labels, error)
            first, last = self.bounds[vs]
            layers = f"layer {first}" if last - first == 1 else f"layers {first} to {last - 1}"
            text = (f"{_stage(vs, self.bounds, self.stages)} ({layers}) failed on "
                    f"{_coming(vs, self.bounds, self.stages)}, of "
                    f"{_words(spec)}: {what}{_compile_report(since)}")
            self.failure = Failure(vs, spec, kind, expected, text, error)
            return None

    def agree(self, wire, specs, last_stage_rank):
        """One all-reduce of every rank's failure and of the model's output spec and
        whether its loss is (sum, count) (from `last_stage_rank`); returns those two."""
        rows = np.zeros((wire.size + 1, 3 + HEADER), np.int32)
        failure = self.failure
        if failure is not None:                     # +1: -1 pads sum to 0
            rows[wire.rank] = [KINDS.index(failure.kind) + 1, failure.vs, failure.expected,
                               *(write_header(failure.spec) + 1)]
        output = specs.get(len(self.bounds))
        if wire.rank == last_stage_rank and output is not None:
            rows[wire.size] = [self.counted, 0, 0, *(write_header(output) + 1)]
        rows = wire.all_reduce(ms.Tensor(rows), tuple(range(wire.size))).asnumpy()
        self._raise_failures(rows[:wire.size])
        return read_header(rows[wire.size, 3:] - 1), bool(rows[wire.size, 0])

    def _raise_failures(self, rows):
        """A boundary's problem told in full everywhere; the model's own error in full
        where it happened, elsewhere as a line naming that rank."""
        failed = sorted({(int(r[1]), KINDS[r[0] - 1], int(r[2]), read_header(r[3:] - 1), rank)
                         for rank, r in enumerate(rows) if r[0]})
        if not failed:
            return
        told = [failure_text(vs, kind, expected, spec, self.bounds, self.stages, self.carried)
                for vs, kind, expected, spec, _ in failed if kind in TOLD_IN_FULL]
        mine = self.failure
        if mine is not None and mine.kind == "model":
            told.append(mine.text)
        if told:
            raise RuntimeError("check before the first step failed: " + "; ".join(told)) \
                from (mine.error if mine is not None else None)
        vs, _, _, _, rank = failed[0]
        raise PeerFailed(f"the check before the first step failed on rank {rank} "
                         f"({_stage(vs, self.bounds, self.stages)}): "
                         f"rank {rank}'s error says why")


def agreed(wire, work, what="while building its stages"):
    """`work()` on every rank, and its result; if it raises anywhere it fails everywhere before
    any rank waits on another: there with its own error, elsewhere with a line naming the rank."""
    try:
        result, error = work(), None
    except Exception as e:               # any exception: a peer must not wait for this rank
        result, error = None, e
    failed = np.zeros(wire.size, np.int32)
    failed[wire.rank] = error is not None
    failed = wire.all_reduce(ms.Tensor(failed), tuple(range(wire.size))).asnumpy()
    if error is not None:
        raise alike(error) if failed.all() else error   # (all failed: told once, by rank 0)
    if failed.any():
        rank = int(np.argmax(failed))
        raise PeerFailed(f"rank {rank} failed {what}: rank {rank}'s error says why")
    return result
