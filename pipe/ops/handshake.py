"""Before the first step, every stage's forward is checked on what will reach it.

`connect_stages` passes each boundary's (shape, dtype) from stage to stage and runs each
forward on it (`probe`: twice, which must agree, or a layer draws its own random numbers
that pipe's backward would draw again). One all-reduce (`StageCheck.agree`) then tells
every rank of every failure before any real message: in full on the rank that found it,
elsewhere as a line naming that rank."""
import glob
import os
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.features.batchnorm import buffers_kept
from pipe.features.precision import computes_half
from pipe.layers import arguments, variable
from pipe.ops.watchdog import PeerFailed, alike, first_line
from pipe.wire import (DTYPES, HEADER, Parts, PointToPoint, carrier, elements, every_rank, example,
                       read_header, spec_of, tensors_in, write_header)

__all__ = ["connect_stages", "StageCheck", "Refused", "unwired", "agreed", "probe",
           "describe_layer"]

FLOATS = (ms.float32, ms.float16, ms.bfloat16, ms.float64)
ONE = ms.Tensor(1.0, ms.float32)              # the loss gradient's scale a check runs with
HALF_HINT = (" (precision='fp16' casts each layer's inputs, not a Parameter its construct "
             "reads itself: cast it to the input's dtype there, `w.astype(x.dtype)`, as "
             "nn.Dense does)")


class Refused(TypeError):
    """What the model or its loss does, found by running it, that pipe cannot train exactly."""


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
    A training forward runs `runs` times: if they differ, `Refused` names the layer."""
    chunk.set_mode(training)
    if not training:
        return spec_of(chunk.infer(x)), False
    if labels is None or not chunk.is_last:      # (given as a step gives it: one compile)
        labels = chunk.no_labels
    with buffers_kept(chunk):
        masks = chunk.masks.learn(x)     # (keeping every unit)
        runs = [chunk.forward_cell(variable(x), labels, ONE, masks)[0] for _ in range(runs)]
    if not _same(runs[0], runs[-1]):
        raise Refused(f"{_random_layer(chunk, x)} draws random numbers inside: two runs "
                      "of its forward on the same input differ, and pipe's backward "
                      "runs it again, drawing others; make each dropout an nn.Dropout "
                      "layer of its own (pipe draws its mask once per micro-batch)")
    if not chunk.is_last:
        return spec_of(runs[0]), False
    logits = spec_of(runs[0][1])          # (the loss gradient's: the logits' shape and dtype)
    return logits, check_loss(chunk.loss_fn.loss_fn, logits, labels)


def check_loss(loss_fn, logits_spec, labels):
    """Whether `loss_fn` returns (sum, count); refused if its count changes with the logits,
    or if it is not one number, the mean over the rows (what pipe's mean of means needs):
    on up to 8 rows of random logits, row 0 twice, it must give the mean of each row's."""
    other = ms.Tensor(np.random.default_rng(0).standard_normal(logits_spec[0]), logits_spec[1])
    loss = loss_fn(ops.zeros(*logits_spec), labels)
    if isinstance(loss, tuple):
        counts = (float(loss[1].asnumpy()), float(loss_fn(other, labels)[1].asnumpy()))
        if counts[0] != counts[1]:
            raise Refused("loss_fn returns (sum, count) and its count changes with the logits "
                          "({:g} for zero logits, {:g} for others): pipe counts on the labels, "
                          "before the first backward; make the count theirs alone".format(*counts))
        return True
    rows, per = [0] + list(range(min(len(labels), 8))), len(other) // len(labels)

    def row(i):                          # (logits rows per label row: a model may flatten)
        return other[i * per:(i + 1) * per], labels[i:i + 1]
    each = np.mean([loss_fn(*row(i)).asnumpy() for i in rows])
    together = loss_fn(*[ops.concat(parts) for parts in zip(*map(row, rows))])
    if loss.size != 1 or not np.isclose(together.asnumpy().item(), each, rtol=1e-4):
        what = (f"a loss of shape {loss.shape}, not one number" if loss.size != 1 else
                f"{together.asnumpy().item():g} on {len(rows)} rows, where their own losses' "
                f"mean is {each:g}: not their mean (a sum, or a mean over the targets it counts?)")
        raise Refused(f"loss_fn gives {what}; return the mean over the rows (reduction='mean'), "
                      "or (sum, count) for a token mean: pipe averages the micro-batches' "
                      "losses, which is one process's only for a mean")
    return False


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
                if isinstance(x, tuple):     # (the backward starts from one tensor's gradient)
                    raise Refused("the model's output must be one tensor, the logits: return "
                                  "them alone from its last layer")
                x = x.astype(ms.float32) if is_half(chunk) else x    # (as LogitsAsFloat32)
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


def _same(one, other):
    """Whether two runs' outputs are equal bit for bit (NaN equal to NaN)."""
    return all(np.array_equal(a.asnumpy(), b.asnumpy(), equal_nan=True)
               for a, b in zip(tensors_in(one), tensors_in(other)))


# ---- what went wrong, in words ---------------------------------------------------------
def is_half(chunk):
    """Whether the chunk computes in float16 (precision='fp16' cast its layers)."""
    return any(map(computes_half, chunk.layers))


def unwired(spec, carried):
    """The index of the first element of `spec` the wire cannot carry, else None."""
    return next((k for k, (_, dtype) in enumerate(elements(spec)) if carrier(dtype) not in carried),
                None)


def mismatched_weights(chunk, spec):
    """(the first weighted layer's index, its weights' dtype) when the input is a float of
    another dtype than those weights (the dtype the stage takes); else None."""
    if isinstance(spec, Parts) or is_half(chunk):
        return None
    first, weight = next(((k, p) for k, layer in enumerate(chunk.layers)
                          for p in layer.trainable_params()), (None, None))
    if weight is not None and spec[1] in FLOATS and spec[1] != weight.dtype:
        return first, weight.dtype
    return None


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


# ---- the check, on every rank ------------------------------------------------------------
class StageCheck:
    """`connect_stages`' probe, keeping this rank's first failure in words, and `agree`,
    which fails every rank if any failed. `bounds[vs]`: the layers of each virtual stage."""

    def __init__(self, chunks, bounds, stages, labels, carried, training=True, runs=2, whole=""):
        self.chunks, self.bounds, self.stages, self.labels = chunks, bounds, stages, labels
        self.carried, self.training, self.runs = carried, training, runs
        self.whole = whole               # the whole batch, in words, for the user's view
        self.failure = None              # (virtual stage, what went wrong, in words)
        self.counted = False             # the loss is (sum, count)

    def probe(self, c, vs, spec):
        """Chunk c's output spec on an input of `spec`, or None after a failure here."""
        if self.failure is not None:
            return None
        chunk, since = self.chunks[c], time.time()
        problem = self.boundary_problem(chunk, vs, spec)
        if problem is None and self.training:    # each piece eagerly first: a mistake is found
            found = locate_failure(chunk, example(spec), self.labels)   # without a compile
            if found is not None:
                problem = self.located(chunk, vs, spec, found, since)
        if problem is None:
            try:
                out, counted = probe(chunk, example(spec), self.labels, self.training, self.runs)
                self.counted = self.counted or counted
                return out
            except Exception as e:           # the user's model: any exception is its error
                problem = self.explain(chunk, vs, spec, e, since)
        self.failure = vs, problem
        return None

    def boundary_problem(self, chunk, vs, spec):
        """What the boundary cannot do, found before the forward runs: an element the wire
        does not carry, an input of another float dtype than the first weights."""
        k = unwired(spec, self.carried) if vs else None       # (the input batch: not carried)
        if k is not None:
            dtype = elements(spec)[k][1]
            element = f"element {k} of " if isinstance(spec, Parts) else ""
            carried = ", ".join(str(d) for d in DTYPES if carrier(d) in self.carried)
            return (f"{self.stage(vs)} would receive {element}{self.coming(vs)} as {dtype}, "
                    "which this wire does not carry; make layer "
                    f"{self.bounds[vs][0] - 1} hand it on as one of {carried}")
        mismatch = mismatched_weights(chunk, spec)    # found before a failed compile's pages
        if mismatch is not None and mismatch[0] == 0:
            return self.dtype_text(vs, spec, mismatch[1])
        return None

    def explain(self, chunk, vs, spec, error, since):
        """The `error` a stage's forward raised on `spec`, in words: the boundary's dtype or
        shape when its first weighted layer cannot take the input, else the model's own error
        with the piece that raised it."""
        if isinstance(error, Refused):
            return self.model_text(vs, spec, str(error), since)
        # (in training each piece already ran alone, before the compile: none failed)
        found = None if self.training else locate_failure(chunk, example(spec), None)
        if found is None:
            return self.model_text(vs, spec, "compiling its forward failed (each layer ran "
                                   f"alone): {first_line(error)}"
                                   f"{HALF_HINT if is_half(chunk) else ''}", since)
        return self.located(chunk, vs, spec, found, since)

    def located(self, chunk, vs, spec, found, since):
        """`locate_failure`'s (layer k, where, the exception) in words; beside a failure on the
        input batch or in the loss (on the labels), the whole batch as the caller passed it."""
        k, where, cause = found
        mismatch = mismatched_weights(chunk, spec)
        layer = chunk.layers[k] if k < len(chunk.layers) else None
        if mismatch is not None and mismatch[0] == k:
            text = self.dtype_text(vs, spec, mismatch[1])
        elif (k == 0 and isinstance(layer, nn.Dense) and not isinstance(spec, Parts)
              and spec[0][-1] != layer.in_channels):
            fix = (f"Fix the model so that layer {self.bounds[vs][0] - 1}'s output fits "
                   f"layer {self.bounds[vs][0]}'s input" if vs
                   else f"Fix the input batch or layer {self.bounds[vs][0]}")
            text = (f"{self.stage(vs)} cannot take {self.coming(vs)}, of {_words(spec)}; its "
                    f"first layer expects {layer.in_channels} features. {fix}")
        else:
            text = self.model_text(vs, spec, f"{where}, raised {first_line(cause)}", since)
        on_batch = vs == 0 or k == len(chunk.layers)
        return text + (f"\n(the whole batch: {self.whole})" if on_batch and self.whole else "")

    def dtype_text(self, vs, spec, weights):
        source = "the input batch" if vs == 0 else f"the output of layer {self.bounds[vs][0] - 1}"
        return (f"dtype mismatch: {self.stage(vs)} receives {self.coming(vs)} as {spec[1]}, but "
                f"the first weights it meets are {weights}; cast {source} to {weights}")

    def model_text(self, vs, spec, what, since):
        first, last = self.bounds[vs]
        layers = f"layer {first}" if last - first == 1 else f"layers {first} to {last - 1}"
        return (f"{self.stage(vs)} ({layers}) failed on {self.coming(vs)}, of {_words(spec)}: "
                f"{what}{_compile_report(since)}")

    def stage(self, vs):
        """"stage 2", or "virtual stage 2" when a stage holds several chunks."""
        return f"stage {vs}" if len(self.bounds) == self.stages else f"virtual stage {vs}"

    def coming(self, vs):
        """What reaches virtual stage vs, in words."""
        first = self.bounds[vs][0]
        return ("the input batch" if vs == 0 else f"{self.stage(vs - 1)}'s output "
                f"(the boundary between layers {first - 1} and {first})")

    def agree(self, wire, specs, last_stage_rank, fingerprint):
        """One all-reduce of where each rank failed, of the model's output spec and whether
        its loss is (sum, count) (from `last_stage_rank`), and of each rank's batch
        `fingerprint`; returns those two. A failure is told in full by the rank that found
        it, elsewhere as a line naming that rank; a batch unlike rank 0's, alike everywhere."""
        failed = 0 if self.failure is None else self.failure[0] + 1
        rows = every_rank(wire, [failed, self.counted, fingerprint,
                                 *write_header(specs.get(len(self.bounds)))])
        if self.failure is not None:
            raise RuntimeError("check before the first step failed: " + self.failure[1]) from None
        if rows[:, 0].any():
            rank = int(np.argmax(rows[:, 0] > 0))
            raise PeerFailed(f"the check before the first step failed on rank {rank} "
                             f"({self.stage(rows[rank, 0] - 1)}): rank {rank}'s error says why")
        if (rows[:, 2] != rows[0, 2]).any():
            rank = int(np.argmax(rows[:, 2] != rows[0, 2]))
            raise alike(ValueError(
                f"rank {rank} passed another batch than rank 0: pipe reads the inputs on the "
                "first stage and the labels on the last, so every rank passes the same global "
                "batch (each replica takes its own rows of it); draw it from one seed everywhere"))
        return read_header(rows[last_stage_rank, 3:]), bool(rows[last_stage_rank, 1])


def agreed(wire, work, what="while building its stages"):
    """`work()` on every rank, and its result; if it raises anywhere it fails everywhere before
    any rank waits on another: there with its own error, elsewhere with a line naming the rank."""
    try:
        result, error = work(), None
    except Exception as e:               # any exception: a peer must not wait for this rank
        result, error = None, e
    failed = every_rank(wire, [error is not None])[:, 0]
    if error is not None:
        raise alike(error) if failed.all() else error   # (all failed: told once, by rank 0)
    if failed.any():
        rank = int(np.argmax(failed))
        raise PeerFailed(f"rank {rank} failed {what}: rank {rank}'s error says why")
    return result
