"""The pipeline engine: one rank's share of a training step, every feature a visible line.

    engine = PipelineEngine(model, loss_fn, make_optimizer, PipelineConfig(stages=2, ...))
    loss = engine.train_step(inputs, labels)    # the global mini-batch, same on every rank

Each rank keeps its stage's layers (pipe.layout) and runs one step function (pipe.step) over
its schedule's actions, as Python or as one compiled graph (pipe.modes says which), then
updates its weights."""
import math
import os
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import NamedTuple

import mindspore as ms

from pipe.actions import Actions, Loop
from pipe.batch import as_tensor, replica_rows, split
from pipe.compiled import Compiled, scalar
from pipe.features.batchnorm import average_buffers
from pipe.features.clip import clip_by_global_norm
from pipe.features.dropout import draws
from pipe.features.precision import LossScaler, float16_gradients, set_matmul_precision
from pipe.features.tied import fold_repeats, sum_copies
from pipe.features.token_loss import TokenCount
from pipe.layout import plan
from pipe.ops import checkpoint, predict
from pipe.ops.deadlines import connect
from pipe.ops.handshake import StageCheck, agreed, connect_stages
from pipe.ops.memory import Held, Memory
from pipe.ops.watchdog import (PipelineError, Watch, WireTimeout, alike_on_every_rank,
                               end_job_on_uncaught)
from pipe.step import Step
from pipe.topology import Topology
from pipe.wire import sum_over

__all__ = ["PipelineEngine", "PipelineError", "prepare_process"]


class Built(NamedTuple):
    """What the stages agreed for one batch shape, and the step built for it."""
    p2p: object          # this rank's messages (pipe.wire.PointToPoint)
    counter: object      # a (sum, count) loss's TokenCount, or None
    step: object         # the step function (pipe.step.Step) for these shapes


def prepare_process(config, wire):
    """All the engine changes outside itself: an uncaught exception on one rank ends
    every rank, MindSpore's failed-compile reports go to the temporary folder (not ./rank_0/om),
    and TF32 is what the config says."""
    if wire.size > 1:
        end_job_on_uncaught(wire)
    reports = os.path.join(tempfile.gettempdir(), f"pipe-compile-rank{wire.rank}")
    os.environ.setdefault("MS_OM_PATH", reports)
    set_matmul_precision(config)


def stage_optimizer(make_optimizer, params):
    """`make_optimizer(params)`, and the index in `params` of each gradient it takes, in its
    order (parameter groups reorder them); refused unless it holds each of `params` once. A
    stage without weights gets nn.Identity, never called: MindSpore's optimizers refuse none."""
    if not params:
        return ms.nn.Identity(), []
    optimizer, index = make_optimizer(params), {id(p): k for k, p in enumerate(params)}
    order = [index.get(id(p)) for p in optimizer.parameters]
    if None in order or sorted(order) != list(range(len(params))):
        raise ValueError(f"make_optimizer built an optimizer over {len(order)} parameters, "
                         f"{len(order) - order.count(None)} of the {len(params)} it was given: "
                         "build it over exactly those (freeze a weight: requires_grad = False)")
    return optimizer, order


def same_start(wire, layout):
    """Every copy of a weight starts as its first holder's (replica 0, buffers and frozen
    weights too; a tied weight's first stage), as torch's DDP broadcasts: a model built
    unseeded differs per rank."""
    params, replicas = layout.params, layout.topo.data_parallel_ranks(layout.stage)
    if len(replicas) > 1:                # (one flat message, as the gradients' sum)
        first = float(layout.replica == 0)
        for p, value in zip(params, sum_over(wire, [p.value() * first for p in params], replicas)):
            p.set_data(value.copy())        # (its own memory: not a view of the flat sum)
        for b in layout.buffers:            # (one message each: each its own dtype)
            b.set_data(wire.all_reduce(b.value() if first else ms.ops.zeros_like(b), replicas))
    for k, ranks in layout.copies.items():    # (in sum_copies' order: every holder alike)
        mine = float(wire.rank == min(ranks))
        params[k].set_data(wire.all_reduce(params[k].value() * mine, ranks))


class PipelineEngine:
    """Runs one rank's share of pipeline-parallel training.

    `model` is an nn.SequentialCell or a list of layer builders (pipe.features.builders);
    `make_optimizer(params)` builds the optimizer over this rank's parameters; `wire`
    overrides the launcher's; `sample` (one micro-batch of inputs) is for partition="time"."""

    def __init__(self, model, loss_fn, make_optimizer, config, wire=None, sample=None):
        with alike_on_every_rank():
            config.check()
            if isinstance(make_optimizer, ms.nn.Cell):     # (a Cell is callable: it would step)
                raise TypeError(f"make_optimizer is an optimizer ({make_optimizer.cls_name}): "
                                "pass a function of a stage's parameters, lambda ps: nn.Adam(ps)")
            weights = loss_fn.trainable_params() if isinstance(loss_fn, ms.nn.Cell) else []
            if weights:                                    # (one process would train them)
                raise TypeError(f"loss_fn holds weights ('{weights[0].name}') pipe would not train "
                                "(it trains the model's layers): move them into the last layer")
        self.config = config = replace(config)     # this engine's copy
        self.loss_fn, self.sample = loss_fn, sample
        self.wire = wire or connect(config.device, config.timeout)
        prepare_process(config, self.wire)
        self.topo = Topology(config.stages, config.data_parallel)
        with alike_on_every_rank():
            self.topo.check_world_size(self.wire.size)
        self.all_ranks = tuple(range(self.wire.size))
        self.layout = plan(model, loss_fn, config, self.wire, sample)
        self.stage, self.replica = self.layout.stage, self.layout.replica
        self.schedule, self.chunks = self.layout.schedule, self.layout.chunks
        self.modes = self.layout.modes   # how every step runs (pipe.modes)
        if self.modes.why and self.wire.rank == 0:
            print(f"pipe: {self.modes}", flush=True)
        same_start(self.wire, self.layout)
        self.optimizer, self.gradient_order = agreed(self.wire, lambda: stage_optimizer(
            make_optimizer, self.layout.params), "building its optimizer")
        self.update = Compiled(self.optimizer)     # (called as MindSpore's own step is)
        self.step = 0                    # optimizer steps taken
        self.mean_weight = 1.0 / (config.micro_batches * config.data_parallel)  # the mean of means
        self.watch = Watch(self.wire, self.stage, self.replica, config.timeout)
        self.output_spec = None          # the model's output (shape, dtype), as last agreed
        self.built = {}                  # batch shapes -> Built: agreed and built once each
        self.predicting = {}             # predict's shapes -> (handlers, messages, output spec)
        self.memory = Memory()           # activation bytes the loop holds in flight
        self.tracer = None               # a pipe.ops.trace.Tracer records a timeline when set
        self.scaler = LossScaler(config.loss_scale, config.loss_scale_window, [
            h for chunk in self.chunks for h in float16_gradients(chunk.layers, chunk.params)]) \
            if config.precision == "fp16" else None     # (pipe.features.precision)

    # ---- one training step ------------------------------------------------------------
    def train_step(self, inputs, labels):
        """One optimizer step on the global mini-batch; returns its loss on every rank."""
        batch = split(self.config, inputs, labels, self.replica)   # this replica's micro-batches
        self.step += 1
        if batch.shapes not in self.built:            # new shapes: the stages agree on them
            self.agree_shapes(batch)
        built = self.built[batch.shapes]
        masks = self.dropout_masks(batch, built.p2p)  # this step's, per unit
        for chunk in self.chunks:                     # (predict puts them in eval mode)
            chunk.set_mode(True)
        losses, grads, count = self.run_step(built.step, self.step_inputs(batch, built, masks))
        weight = self.loss_weight(count)              # what each micro-batch's loss counts
        self.update_weights(grads)
        return self.step_loss(losses, weight)

    def loss_weight(self, count):
        """What each micro-batch's loss counts in the step's loss: `mean_weight`, or
        1/count for a (sum, count) loss (pipe.features.token_loss), whose count of 0 is refused."""
        if count is None:
            return self.mean_weight
        total = float(count.asnumpy())
        if total <= 0:
            self.watch.end(self.schedule)        # the step ends here: the user's code runs next
            raise ValueError(f"loss_fn counts {total:g} targets in this step's whole batch: its "
                             "token mean (sum / count) is undefined; leave such batches out")
        return 1.0 / total

    def run_step(self, step, inputs):
        """The step function (pipe.step) on `inputs`: (this rank's losses' sum, its weight
        gradients summed over the micro-batches, a (sum, count) loss's count or None). The loop
        watches each action; one graph is watched as one piece, until its messages are done."""
        self.watch.begin(self.schedule)  # (a schedule's first step compiles: not timed)
        if not step.one_graph:
            losses, grads, _, count = step.run(*inputs)
        else:
            where = "the step's compiled graph; one_graph=False names the action"
            with self.watch.at(where), self.span("step graph"):
                losses, grads, done, count = step.run(*inputs)
                if step.sends:           # waits inside the watch: a failed message is this step's
                    done.asnumpy()
        return losses, grads, count if step.counter is not None else None

    def step_inputs(self, batch, built, masks):
        """The step's inputs: this replica's rows and labels, the dropout masks, the loss
        gradient's scale, a (sum, count) loss's labels. The scale is `mean_weight` (a (sum,
        count) loss divides by its count on the device instead), x S in fp16: in one graph a
        plain number it folds in, unless S or the count moves it, else a tensor."""
        counter = built.counter
        if self.modes.one_graph and not (self.scaler or counter):
            scale = self.mean_weight
        else:
            scale = scalar((self.scaler.value if self.scaler else 1.0) *
                           (1.0 if counter else self.mean_weight))
        return (*replica_rows(batch), masks, scale, as_tensor(batch.source[1]) if counter else ())

    def update_weights(self, grads):
        """Sum over the replicas, unscale (fp16), sum tied copies, clip, step."""
        with self.watch.at("the all-reduce of the gradients and the optimizer's step"):
            with self.span("all-reduce"):     # the whole batch's gradients, per chunk
                grads = sum_over(self.wire, grads, self.topo.data_parallel_ranks(self.stage))
            if self.scaler:                   # checked as one process's whole-batch step would be
                grads, finite = self.scaler.unscale(self.wire, grads)
                if not finite:           # a gradient overflowed on some rank: all skip the step
                    return
            if self.layout.repeats:      # a weight two of this rank's chunks hold: summed
                grads = fold_repeats(grads, self.layout.repeats, len(self.layout.params))
            grads = sum_copies(self.wire, grads, self.layout.copies)
            if self.config.clip_grad_norm:
                grads = clip_by_global_norm(self.wire, grads, self.layout.norm_once,
                                            self.config.clip_grad_norm, self.all_ranks,
                                            self.config.data_parallel)
            if self.gradient_order:           # (a stage without weights: nothing to step)
                self.update(ms.mutable(tuple(grads[k] for k in self.gradient_order)))

    def step_loss(self, losses, weight):
        """The step's loss on every rank, every rank's losses summed x `weight`; batch norm's
        statistics averaged over the replicas on the way."""
        replicas = self.topo.data_parallel_ranks(self.stage)
        with self.watch.at("the all-reduce of the moving statistics and the loss"):
            if self.layout.buffers and len(replicas) > 1:
                average_buffers(self.wire, self.layout.buffers, replicas)
            if self.wire.size > 1:       # (a wire sums vectors)
                losses = self.wire.all_reduce(losses.reshape(1), self.all_ranks)
            loss = losses.asnumpy().item() * weight
        self.watch.end(self.schedule)
        if not math.isfinite(loss):      # the same value on every rank: all stop together
            raise FloatingPointError(f"the step's loss is {loss}: training diverged; lower the "
                                     "learning rate or check the inputs for NaN/inf")
        return loss

    def dropout_masks(self, batch, p2p, drawn=True):
        """Each micro-batch's dropout masks for each chunk, micro-batch first
        (pipe.features.dropout); `drawn` off keeps every unit, for the shapes."""
        if not any(chunk.masks.dropouts for chunk in self.chunks):    # no dropout: none to draw
            return ((),) * (len(batch.cut) * len(self.chunks))
        step = draws(self.config, batch, self.step) if drawn else [None] * len(batch.cut)
        held = self.layout.virtual_stages_held
        masks = tuple(chunk.masks.of(p2p.specs[vs], step[m])
                      for m in range(len(batch.cut)) for chunk, vs in zip(self.chunks, held))
        return ms.mutable(masks) if any(masks) else masks   # (the graph's variables)

    @contextmanager
    def around(self, schedule, i):
        with self.watch.at((schedule, i)), self.span(str(schedule.actions[self.stage][i])):
            yield

    def span(self, name):
        return self.tracer.span(name) if self.tracer else nullcontext()

    # ---- before a step on new shapes ----------------------------------------------------
    def agree_shapes(self, batch, training=True):
        """The stages agree on what crosses each boundary, each forward checked first
        (pipe.ops.handshake); in training, pipe's choices are made and the step is built."""
        with self.watch.reported("the shape check before the first step", catch=WireTimeout):
            check = StageCheck(self.chunks, self.layout.all_bounds, self.config.stages,
                               batch.labels[0] if training else None, self.wire.dtypes, training,
                               runs=1 if self.built else 2, whole=batch.words())
            ranks = self.topo.pipeline_ranks(self.replica)
            p2p = connect_stages(self.schedule, self.stage, self.wire, ranks, batch.inputs[0],
                                 check.probe)
            last = self.topo.rank_of(self.schedule.stage_of(self.schedule.virtual_stages - 1), 0)
            self.output_spec, counted = check.agree(self.wire, p2p.specs, last,
                                                    batch.fingerprint())
        if not training:
            return p2p
        counter = Compiled(TokenCount(self.loss_fn, self.output_spec)) if counted else None
        self.built[batch.shapes] = built = Built(p2p, counter, self.build_step(batch, p2p, counter))
        if self.modes.one_graph and self.wire.size > 1:  # a compile failing anywhere fails all
            inputs = self.step_inputs(batch, built, self.dropout_masks(batch, p2p, drawn=False))
            agreed(self.wire, lambda: built.step.prepare(*inputs),
                   "compiling the step as one graph")
        return p2p

    def build_step(self, batch, p2p, counter):
        """The step function for these shapes: its handlers traced into one graph, or run as
        the loop, each action watched and its bytes in flight counted."""
        if self.modes.one_graph:
            return Step(Actions(self.layout, p2p, compiled=True), counter, one_graph=True)
        stores = (lambda: (Held(self.memory, ("kept", batch.shapes)),
                           Held(self.memory, ("waiting", batch.shapes))))
        return Step(Loop(self.layout, p2p, stores, lambda i: self.around(self.schedule, i)),
                    counter, one_graph=False)

    # ---- beyond the step --------------------------------------------------------------
    predict, evaluate = predict.predict, predict.evaluate    # (pipe.ops.predict)

    def all_reduce(self, what, tensor, ranks):
        with self.watch.reported(what, catch=WireTimeout):
            return self.wire.all_reduce(tensor, ranks)

    def barrier(self):
        self.all_reduce("a barrier", ms.Tensor([0], ms.int32), self.all_ranks).asnumpy()

    def save(self, directory, step, meta=None):
        """Checkpoint after `step` steps (pipe.ops.checkpoint): replica 0 writes each
        stage's parameters and optimizer state, rank 0 merges and seals it; `meta` is the
        caller's (seed, data position). Returns the step's folder."""
        where = checkpoint.step_dir(directory, step)
        if self.wire.rank == 0:
            checkpoint.clear(where)
        self.barrier()
        checkpoint.save_rank(where, self.layout, self.optimizer)
        self.barrier()
        if self.wire.rank == 0:
            scale = self.scaler.state() if self.scaler else {}
            checkpoint.finish(directory, step, {**self.layout.describe(), **scale, **(meta or {})})
        self.barrier()
        return where

    def resume(self, directory):
        """Load the newest verified checkpoint in `directory`, saved with any layout;
        returns its meta."""
        where, meta = agreed(self.wire, lambda: checkpoint.latest(directory),
                             "finding the checkpoint to resume")      # (a missing one: said once)
        checkpoint.load_rank(where, self.parameters_dict(), self.optimizer, self.stage)
        self.step = meta["step"]
        if self.scaler:
            self.scaler.load(meta)
        return meta

    def parameters_dict(self):
        """{whole-model name (`3.weight`): Parameter} of this rank's parameters and
        buffers, as mindspore.save_checkpoint names them in the unsplit model."""
        return {name: p for chunk, names in zip(self.chunks, self.layout.names)
                for name, p in zip(names, chunk.state)}

    def load_parameters(self, param_dict):
        """Set this rank's parameters and buffers from `param_dict` (a merged model.ckpt
        or the unsplit model's); refuses a missing name or another shape."""
        checkpoint.load_params(self.parameters_dict(), param_dict, "the parameters given",
                               "load those of the model this engine trains")
