"""The pipeline engine: executes this rank's schedule, then reduces gradients and steps.

    engine = PipelineEngine(model, loss_fn, make_optimizer, PipelineConfig(stages=2, ...))
    loss = engine.train_step(inputs, labels)    # the global mini-batch, same on every rank

Every rank builds the same full model (same seed) or, given layer builders, only its own
layers (pipe.builders); it keeps its stage's layers (pipe.layout) and walks its list of
schedule actions: F, B, W and the sends/receives between them, one call each, or with
`one_graph` all of them as one compiled graph (pipe.step_graph). The engine itself decides
nothing about order; `pipe.schedule` does (`python -m pipe` prints one).
"""
import math
import os
import tempfile
from contextlib import nullcontext

import mindspore as ms
from mindspore import nn, ops

from pipe import allreduce, checkpoint, microbatch
from pipe.comm import WireTimeout, connect
from pipe.handshake import connect_stages
from pipe.layout import plan
from pipe.step_graph import StepGraph, updates_in_graph
from pipe.watchdog import PipelineError, Watch, end_job_on_uncaught

__all__ = ["PipelineEngine", "PipelineError"]


class _CompiledUpdate(nn.Cell):
    """The optimizer step as one compiled graph: op by op it costs more than the backward."""

    def __init__(self, optimizer):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    @ms.jit
    def construct(self, grads):
        return self.optimizer(grads)


class PipelineEngine:
    """Runs one rank's share of pipeline-parallel training.

    `model` is an nn.SequentialCell or a list of layer builders (pipe.builders).
    `make_optimizer(params)` builds the optimizer over this rank's parameters. `wire`
    overrides the launcher's (pipe.comm.connect); `sample`, one micro-batch of inputs, is
    needed by partition="time" to time the layers.
    """

    def __init__(self, model, loss_fn, make_optimizer, config, wire=None, sample=None):
        config.check()
        self.config = config
        self.wire = wire or connect(config.device, config.timeout)
        if self.wire.size > 1:           # peers must not wait on a rank that failed
            end_job_on_uncaught(self.wire)
        # MindSpore writes a failed compile's report under ./rank_<r>/om/ unless told otherwise.
        os.environ.setdefault("MS_OM_PATH", os.path.join(tempfile.gettempdir(),
                                                         f"pipe-compile-rank{self.wire.rank}"))
        self.layout = plan(model, loss_fn, config, self.wire, sample)
        # With one graph and nothing to all-reduce, the optimizer steps inside the graph.
        self.update_in_graph = config.one_graph and updates_in_graph(self.layout)
        self.chunks, self.schedule = self.layout.chunks, self.layout.schedule
        self.optimizer = make_optimizer(self.layout.params)
        self._update = _CompiledUpdate(self.optimizer)
        self.watch = Watch(self.wire, self.layout.stage, self.layout.replica, config.timeout)
        self.p2p = None                  # set by the shape handshake before the first step
        self.trains_checked = False      # whether the handshake ran the training forward
        self._graph = None               # the step as one compiled graph, when config.one_graph
        self.tracer = None               # a pipe.trace.Tracer records a timeline when set
        self.step = 0                    # optimizer steps taken (dropout masks depend on it)
        self._inbox, self._outbox = {}, {}  # tensors received / to send, by (F or B, mb, chunk)
        self._run = {"F": self._forward, "B": self._backward, "W": self._weight_grad,
                     "sF": self._send, "sB": self._send, "rF": self._recv, "rB": self._recv}

    # ---- one training step ------------------------------------------------------------
    def train_step(self, inputs, labels):
        """One optimizer step on the global mini-batch; returns its mean loss on every rank."""
        layout = self.layout
        batch = microbatch.split(self.config, inputs, labels, layout.replica, self.step + 1)
        self.step += 1                   # counted once the batch is accepted
        if not self.trains_checked:
            self._handshake(batch)
        for chunk in self.chunks:
            chunk.zero_grads()
        # The gradient arithmetic. The model's last chunk starts each micro-batch's backward
        # from d loss / d logits x 1/(M x D) (pipe.layout), each chunk sums its M micro-
        # batches' weight gradients as they come (pipe.chunk), and the all-reduce sums over
        # the D replicas: the sum of M x D micro-batch means / (M x D) is the mini-batch
        # mean, the gradient one process computes on the whole batch.
        if self.config.one_graph:                               # the same, as one call
            share = self._run_graph(batch)
        else:
            self._execute(self.schedule, self.p2p, batch)      # recv -> F -> send ... B, W
            share = allreduce.loss_share(batch.outputs, self.config.micro_batches)
        replicas = layout.topo.data_parallel_ranks(layout.stage)
        world = tuple(range(layout.topo.world_size))
        if not self.update_in_graph:
            self._reduce_and_update(replicas, world)
        with self.watch.at("the all-reduce of the moving statistics and the loss"):
            if layout.buffers and len(replicas) > 1:
                allreduce.average_buffers(self.wire, layout.buffers, replicas)
            loss = allreduce.step_loss(self.wire, share, len(replicas), world)
        self.watch.end(self.schedule)
        if not math.isfinite(loss):      # the same value on every rank: all stop together
            raise FloatingPointError(f"the step's loss is {loss}: training diverged; lower the "
                                     "learning rate or check the inputs for NaN/inf")
        return loss

    def _reduce_and_update(self, replicas, world):
        """Sum the gradients over the replicas (and tied copies), clip them, step."""
        layout = self.layout
        with self.watch.at("the all-reduce of the gradients"), self._span("all-reduce"):
            grads = allreduce.sum_gradients(self.wire, tuple(g for c in self.chunks for g in c.grads),
                                            replicas, layout.tied)
            if self.config.clip_grad_norm:
                grads = allreduce.clip_by_global_norm(self.wire, grads, layout.counted,
                                                      self.config.clip_grad_norm, world, len(replicas))
        with self._span("optimizer"):
            self._update(ms.mutable(grads))

    def predict(self, inputs, broadcast=True):
        """Forward-only pipeline over `inputs` (the whole batch, on every replica). Returns the
        model's outputs as numpy on every rank, or only on the last stage when `broadcast` is
        off (None elsewhere), like MindSpore's pipeline_result_broadcast."""
        batch = microbatch.split_for_predict(self.config, inputs)
        if self.p2p is None:             # (before the first train_step: eval mode, no loss)
            self._handshake(batch)
        self._execute(self.layout.forward_only, self.p2p.with_rows(len(batch.inputs[0])), batch)
        self.watch.end(self.layout.forward_only)
        last = self.chunks[-1].is_last
        out = ops.cat(batch.outputs) if last else None
        if not broadcast:
            return out.asnumpy() if last else None
        shape, dtype = self.output_spec
        out = out if last else ops.zeros((len(inputs),) + shape[1:], dtype)
        with self.watch.reported("the broadcast of the outputs", catch=WireTimeout):
            return self.wire.all_reduce(out, self.p2p.ranks).asnumpy()

    def _execute(self, schedule, p2p, batch):
        """Run this rank's actions in order. This loop is the whole runtime."""
        self._p2p_now = p2p
        self.watch.begin(schedule)
        for i, action in enumerate(schedule.actions[self.layout.stage]):
            with self.watch.at((schedule, i)), self._span(str(action)):
                self._run[action.kind](action, batch)

    def _run_graph(self, batch):
        """The step's actions as one compiled graph (pipe.step_graph), built at its first
        call. Returns this rank's share of the step's loss."""
        if self._graph is None:
            update = self._update if self.update_in_graph else None
            self._graph = StepGraph(self.layout, self.p2p, update)
        self.watch.begin(self.schedule)  # (its first call compiles: not timed)
        with self.watch.at("the step's compiled graph"), self._span("step graph"):
            share, grads, done = self._graph(*batch.rows(), self._dropout_masks(batch))
            done.asnumpy()               # waits inside the watch: a failed message is this step's
        for chunk, summed in zip(self.chunks, grads):
            chunk.grads = summed
        return share

    def _dropout_masks(self, batch):
        """Each micro-batch's dropout masks for each chunk, as the loop draws them."""
        held = self.layout.virtual_stages_held
        return tuple(chunk.dropout_masks(self.p2p.shapes[vs][0], draw)
                     for draw in batch.draws for chunk, vs in zip(self.chunks, held))

    def _span(self, name):
        return self.tracer.span(name) if self.tracer else nullcontext()

    # ---- the actions ------------------------------------------------------------------
    def _forward(self, action, batch):
        chunk, key = self.chunks[action.chunk], ("F", action.mb, action.chunk)
        first = self.schedule.virtual_stage(self.layout.stage, action.chunk) == 0
        x = batch.inputs[action.mb] if first else self._inbox.pop(key)
        if batch.training:
            out = chunk.forward(action.mb, x, batch.labels[action.mb], batch.draws[action.mb])
        else:
            out = chunk.infer(x)
        if chunk.is_last:
            batch.outputs.append(out)
        else:
            self._hand_on(key, +1, out)

    def _backward(self, action, batch):
        chunk, key = self.chunks[action.chunk], ("B", action.mb, action.chunk)
        dy = self._inbox.pop(key, None)
        backward = chunk.backward_input if self.schedule.split_backward else chunk.backward
        dx = backward(action.mb, dy)
        if self.schedule.virtual_stage(self.layout.stage, action.chunk) > 0:
            self._hand_on(key, -1, dx)

    def _hand_on(self, key, step, tensor):
        """To the next (+1) or previous (-1) virtual stage: straight into its inbox when
        this rank holds it too (the turn of ZB-V's and DualPipeV's V), else to the outbox
        for a send."""
        kind, mb, chunk = key
        to = self.schedule.virtual_stage(self.layout.stage, chunk) + step
        if self.schedule.holds(self.layout.stage, to):
            self._inbox[(kind, mb, self.schedule.chunk_of(to))] = tensor
        else:
            self._outbox[key] = tensor

    def _weight_grad(self, action, batch):   # one micro-batch, or all (deferred to the flush)
        self.chunks[action.chunk].backward_weight(self.schedule.micro_batches_of(action))

    def _send(self, action, batch):          # sF / sB: the activation or gradient F / B made
        self._p2p_now.send(self._outbox.pop((action.kind[1], action.mb, action.chunk)), action)

    def _recv(self, action, batch):          # rF / rB: what this micro-batch's F / B needs
        self._inbox[(action.kind[1], action.mb, action.chunk)] = self._p2p_now.recv(action)

    # ---- between steps ----------------------------------------------------------------
    def save(self, directory, step, meta=None):
        """Checkpoint after `step` steps: replica 0 writes each stage's parameters and
        optimizer state; rank 0 then merges and seals it (see pipe.checkpoint). `meta`
        adds what the caller needs to resume (seed, data position)."""
        checkpoint.save_rank(checkpoint.step_dir(directory, step), self.layout, self.optimizer)
        self.barrier()
        if self.wire.rank == 0:
            checkpoint.finish(directory, step, {**self.layout.describe(), **(meta or {})})
        self.barrier()

    def resume(self, directory):
        """Load the newest checkpoint in `directory` (verified), saved with this layout or
        any other; returns its meta."""
        where, meta = checkpoint.latest(directory)
        checkpoint.load_rank(where, self.parameters_dict(), self.optimizer)
        self.step = meta["step"]
        return meta

    def barrier(self):
        with self.watch.reported("a barrier", catch=WireTimeout):
            self.wire.all_reduce(ms.Tensor([0], ms.int32), tuple(range(self.wire.size))).asnumpy()

    def _handshake(self, batch):
        with self.watch.reported("the shape check before the first step", catch=WireTimeout):
            self.p2p, self.output_spec = connect_stages(self.wire, self.layout, batch.inputs[0],
                                                        batch.labels[0], batch.training)
        self.trains_checked = batch.training

    # ---- weights by whole-model name --------------------------------------------------
    def parameters_dict(self):
        """{whole-model name: Parameter} of this rank's parameters and buffers, named as
        `mindspore.save_checkpoint` names them in the unsplit model (`3.weight`), in every
        mode: a rank's stages rename their cells, and one_graph wraps them again."""
        return {name: p for chunk, names in zip(self.chunks, self.layout.names)
                for name, p in zip(names, chunk.state)}

    def load_parameters(self, param_dict):
        """Set this rank's parameters and buffers from `param_dict` ({whole-model name:
        Parameter or Tensor}, as `mindspore.load_checkpoint` reads the merged model.ckpt
        or a checkpoint of the unsplit model). Refuses a missing name or another shape."""
        checkpoint.load_params(self.parameters_dict(), param_dict, "the parameters given",
                               "load those of the model this engine trains")

