"""The pipeline engine: executes this rank's schedule, then reduces gradients and steps.

    engine = PipelineEngine(model, loss_fn, make_optimizer, PipelineConfig(stages=2, ...))
    loss = engine.train_step(inputs, labels)    # the global mini-batch, same on every rank

Every rank builds the same full model (same seed), keeps its stage's layers, and walks its
list of schedule actions: F, B, and the sends/receives between them. The engine itself
decides nothing about order; `pipe.schedule` does (`python -m pipe` prints one).
"""
import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe import allreduce, checkpoint
from pipe.comm import PointToPoint, WireTimeout, connect
from pipe.config import PipelineConfig
from pipe.dropout import MaskDraw
from pipe.handshake import handshake
from pipe.layout import build_layout
from pipe.partition import check_model, timed_costs
from pipe.schedule import forward_only, lower
from pipe.simulator import checked_schedule, format_position
from pipe.topology import Topology
from pipe.trace import merge_traces
from pipe.watchdog import Watchdog

__all__ = ["PipelineConfig", "PipelineEngine", "PipelineError"]


class PipelineError(RuntimeError):
    """An action failed on this rank (or a peer stopped answering); says where.
    `abort()` ends every process of the job: peers may be stuck waiting for this one."""

    def __init__(self, message, wire):
        super().__init__(message)
        self.wire = wire

    def abort(self, code=1):
        self.wire.abort(code)


class _CompiledUpdate(nn.Cell):
    """The optimizer step as one compiled graph: op by op it costs more than the backward."""

    def __init__(self, optimizer):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    @ms.jit
    def construct(self, grads):
        return self.optimizer(grads)


@dataclass
class _Batch:
    """One step's micro-batches, and what the last stage produced from them."""
    inputs: list
    labels: list
    training: bool
    draws: list = field(default_factory=list)     # each micro-batch's dropout masks
    outputs: list = field(default_factory=list)   # losses (training) or model outputs


class PipelineEngine:
    """Runs one rank's share of pipeline-parallel training."""

    def __init__(self, model, loss_fn, make_optimizer, config: PipelineConfig, wire=None,
                 sample=None):
        """`sample`: one micro-batch of inputs, needed by partition="time" to time layers."""
        config.check()
        check_model(model)
        self.config = config
        self.topo = Topology(config.stages, config.data_parallel)
        self.wire = wire or connect(config.device, config.timeout)
        self.topo.check_world_size(self.wire.size)
        costs = config.partition if config.partition != "time" else \
            timed_costs(model, sample, self.wire, self.topo.world_size)
        rank = self.wire.rank
        self.me, self.replica = self.topo.stage_of(rank), self.topo.replica_of(rank)
        v = config.virtual_stages
        self.schedule = checked_schedule(config.schedule, config.stages, config.micro_batches, v)
        layout = build_layout(model, loss_fn, config, self.schedule, self.topo, self.me, costs)
        self.chunks, self.bounds, self.all_bounds = layout.chunks, layout.bounds, layout.all_bounds
        self.param_names, self.tied = layout.names, layout.tied
        self.params, self.buffers = layout.params, layout.buffers
        self._counted = [k not in self.tied or rank == min(      # in the norm: a tied weight on
            r for r in self.tied[k] if self.topo.replica_of(r) == self.replica)   # one rank only
            for k in range(len(self.params))]
        self.optimizer = make_optimizer(self.params)
        self._update = _CompiledUpdate(self.optimizer)
        self.forward_only = lower(forward_only(config.stages, config.micro_batches, v))
        self.p2p = None                  # set by the shape handshake before the first step
        self.tracer = None               # a pipe.trace.Tracer records a timeline when set
        self.watchdog = None if self.wire.has_deadlines else Watchdog(config.timeout, self._where)
        self.step = 0                    # optimizer steps taken (dropout masks depend on it)
        self._inbox, self._outbox = {}, {}  # tensors received / to send, by (F or B, mb, chunk)
        self._run = {"F": self._forward, "B": self._backward, "W": self._weight_grad,
                     "sF": self._send, "sB": self._send, "rF": self._recv, "rB": self._recv}

    # ---- one training step ------------------------------------------------------------
    def train_step(self, inputs, labels):
        """One optimizer step on the global mini-batch; returns its mean loss on every rank."""
        batch = self._micro_batches(inputs, labels, training=True)
        self.step += 1                   # counted once the batch is accepted
        if self.p2p is None:
            self._handshake(batch.inputs[0], batch.labels[0])
        for chunk in self.chunks:
            chunk.zero_grads()
        # The gradient arithmetic. The last stage starts each micro-batch's backward from
        # d loss / d logits x 1/(M x D) (pipe.layout), each chunk sums its M micro-batches'
        # weight gradients as they come (pipe.stage), and the all-reduce sums over the D
        # replicas: the sum of M x D micro-batch means / (M x D) is the mini-batch mean, the
        # gradient one process computes on the whole batch.
        self._execute(self.schedule, self.p2p, batch)          # recv -> F -> send ... B, W
        replicas, world = self.topo.data_parallel_ranks(self.me), tuple(range(self.topo.world_size))
        with self._at("the all-reduce of the gradients"), self._span("all-reduce"):
            grads = allreduce.sum_gradients(self.wire, tuple(g for c in self.chunks for g in c.grads),
                                            replicas, self.tied)
            if self.config.clip_grad_norm:
                grads = allreduce.clip_by_global_norm(self.wire, grads, self._counted,
                                                      self.config.clip_grad_norm, world, len(replicas))
        with self._span("optimizer"):
            self._update(ms.mutable(grads))                    # update
        with self._at("the all-reduce of the moving statistics and the loss"):
            if self.buffers and len(replicas) > 1:
                allreduce.average_buffers(self.wire, self.buffers, replicas)
            loss = allreduce.step_loss(self.wire, batch.outputs, self.config.micro_batches,
                                       len(replicas), world)
        self._disarm(self.schedule)
        if not math.isfinite(loss):      # the same value on every rank: all stop together
            raise FloatingPointError(f"the step's loss is {loss}: training diverged; lower the "
                                     "learning rate or check the inputs for NaN/inf")
        return loss

    def predict(self, inputs, broadcast=True):
        """Forward-only pipeline over `inputs` (the whole batch, on every replica). Returns the
        model's outputs as numpy on every rank, or only on the last stage when `broadcast` is
        off (None elsewhere), like MindSpore's pipeline_result_broadcast."""
        batch = self._micro_batches(inputs, np.zeros(len(inputs), np.int32), training=False)
        if self.p2p is None:
            self._handshake(batch.inputs[0], batch.labels[0])
        rows = len(batch.inputs[0])
        shapes = {vs: ((rows,) + shape[1:], dtype) for vs, (shape, dtype) in self.p2p.shapes.items()}
        p2p = PointToPoint(self.wire, self.p2p.ranks, shapes)
        self._execute(self.forward_only, p2p, batch)
        self._disarm(self.forward_only)
        last = self.chunks[-1].is_last
        out = np.concatenate([o.asnumpy() for o in batch.outputs]) if last else None
        if not broadcast:
            return out
        shape, dtype = self.output_spec
        out = ms.Tensor(out) if last else ops.zeros((len(inputs),) + shape[1:], dtype)
        with self._reported("the broadcast of the outputs", catch=WireTimeout):
            return self.wire.all_reduce(out, self.p2p.ranks).asnumpy()

    def _execute(self, schedule, p2p, batch):
        """Run this rank's actions in order. This loop is the whole runtime."""
        self._p2p_now = p2p
        if self.watchdog:
            self.watchdog.begin(schedule.name)
        for i, action in enumerate(schedule.actions[self.me]):
            with self._at((schedule, i)), self._span(str(action)):
                self._run[action.kind](action, batch)

    def _at(self, position):
        """A piece of the step that may wait on peers: the watchdog (GPU) times it, and any
        error in it is reported as this rank's (peers may be waiting on it)."""
        self._arm(position)
        return self._reported(position)

    @contextmanager
    def _reported(self, position, catch=Exception):
        """A failure here becomes a PipelineError saying which rank was where, so that the
        job ends (PipelineError.abort) instead of hanging."""
        try:
            yield
        except catch as e:
            raise PipelineError(f"{e}\n{self._where(position)}", self.wire) from e

    def _arm(self, where):
        """Time the wait that starts now, once this kind of step has run (compiled) once."""
        if self.watchdog:
            self.watchdog.progress(where)

    def _disarm(self, schedule):
        """Between steps the user's code runs: nothing to time."""
        if self.watchdog:
            self.watchdog.pause(schedule.name)

    def _where(self, position):
        """Which rank, which action, shown in this rank's action list."""
        schedule, i = position if isinstance(position, tuple) else (None, 0)
        head = f"rank {self.wire.rank} (stage {self.me}, replica {self.replica})"
        if schedule is None:
            return f"{head} was in {position}"
        return (f"{head} was at action {i} ({schedule.actions[self.me][i]}) of its "
                f"{schedule.name} schedule:\n{format_position(schedule, self.me, i)}")

    def _span(self, name):
        return self.tracer.span(name) if self.tracer else nullcontext()

    def _micro_batches(self, inputs, labels, training):
        """This replica's rows of the global batch (all rows when predicting), in M pieces."""
        M, D = self.config.micro_batches, self.config.data_parallel
        if training and (len(inputs) != self.config.batch_size or len(labels) != len(inputs)):
            raise ValueError(f"train_step got {len(inputs)} inputs and {len(labels)} labels; "
                             f"the configured global batch size is {self.config.batch_size}")
        if not training and len(inputs) % M:
            raise ValueError(f"predict got {len(inputs)} inputs, not divisible into {M} "
                             f"micro-batches: pass a multiple of {M}")
        rows = len(inputs) // D if training else len(inputs)
        start, size = (self.replica * rows if training else 0), rows // M
        cut = [slice(start + m * size, start + (m + 1) * size) for m in range(M)]
        as_tensor = lambda a: a if isinstance(a, ms.Tensor) else ms.Tensor(np.asarray(a))
        draws = [MaskDraw(self.config.seed, self.step + 1, c, len(inputs)) for c in cut] \
            if training else []          # dropout masks of the step about to run
        return _Batch([as_tensor(inputs[c]) for c in cut], [as_tensor(labels[c]) for c in cut],
                      training, draws)

    # ---- the actions ------------------------------------------------------------------
    def _forward(self, action, batch):
        stage, key = self.chunks[action.chunk], ("F", action.mb, action.chunk)
        first = self.schedule.virtual_stage(self.me, action.chunk) == 0
        x = batch.inputs[action.mb] if first else self._inbox.pop(key)
        if batch.training:
            out = stage.forward(action.mb, x, batch.labels[action.mb], batch.draws[action.mb])
        else:
            out = stage.infer(x)
        if stage.is_last:
            batch.outputs.append(out)
        else:
            self._outbox[key] = out

    def _backward(self, action, batch):
        stage, key = self.chunks[action.chunk], ("B", action.mb, action.chunk)
        dy = self._inbox.pop(key, None)
        backward = stage.backward_input if self.schedule.split_backward else stage.backward
        dx = backward(action.mb, dy)
        if self.schedule.virtual_stage(self.me, action.chunk) > 0:
            self._outbox[key] = dx

    def _weight_grad(self, action, batch):
        self.chunks[action.chunk].backward_weight(action.mb)

    def _send(self, action, batch):          # sF / sB: the activation or gradient F / B made
        self._p2p_now.send(self._outbox.pop((action.kind[1], action.mb, action.chunk)), action)

    def _recv(self, action, batch):          # rF / rB: what this micro-batch's F / B needs
        self._inbox[(action.kind[1], action.mb, action.chunk)] = self._p2p_now.recv(action)

    # ---- after the schedule -------------------------------------------------------------
    def save(self, directory, step, meta=None):
        """Checkpoint after `step` steps: replica 0 writes each stage's parameters and
        optimizer state; rank 0 then merges and seals it (see pipe.checkpoint). `meta`
        adds what the caller needs to resume (seed, data position)."""
        where = checkpoint.step_dir(directory, step)
        if self.replica == 0:
            for c, chunk in enumerate(self.chunks):
                vs = self.schedule.virtual_stage(self.me, c)
                checkpoint.save_params(checkpoint.stage_file(where, vs),
                                       zip(self.param_names[c], chunk.state))
            checkpoint.save_params(checkpoint.optimizer_file(where, self.me),
                                   self.optimizer.parameters_and_names())
        self.barrier()
        if self.wire.rank == 0:
            checkpoint.finish(directory, step, {**self._layout(), **(meta or {})})
        self.barrier()

    def resume(self, directory):
        """Load the newest checkpoint in `directory` (verified); returns its meta."""
        where, meta = checkpoint.latest(directory)
        saved = {k: meta.get(k) for k in self._layout()}
        if saved != self._layout():
            raise checkpoint.CheckpointError(
                f"checkpoint {where!r} was saved with {saved}, this run is {self._layout()}: "
                "resume with the same stages, data_parallel, schedule, virtual_stages and partition")
        for c, chunk in enumerate(self.chunks):
            vs = self.schedule.virtual_stage(self.me, c)
            values = ms.load_checkpoint(checkpoint.stage_file(where, vs))
            for p, name in zip(chunk.state, self.param_names[c]):
                p.set_data(values[name])
        ms.load_param_into_net(self.optimizer, ms.load_checkpoint(checkpoint.optimizer_file(where, self.me)))
        self.step = meta["step"]
        return meta

    def _layout(self):
        c = self.config
        return {"stages": c.stages, "data_parallel": c.data_parallel, "schedule": c.schedule,
                "virtual_stages": c.virtual_stages, "bounds": [list(b) for b in self.all_bounds]}

    def write_trace(self, path):
        """Every rank writes its recorded spans; rank 0 merges them into `path`."""
        self.tracer.write(f"{path}.rank{self.wire.rank}")
        self.barrier()
        if self.wire.rank == 0:
            merge_traces([f"{path}.rank{r}" for r in range(self.topo.world_size)], path)
        self.barrier()

    def barrier(self):
        with self._reported("a barrier", catch=WireTimeout):
            self.wire.all_reduce(ms.Tensor([0], ms.int32), tuple(range(self.topo.world_size))).asnumpy()

    def _handshake(self, x, labels):
        ranks = self.topo.pipeline_ranks(self.replica)
        with self._reported("the shape check before the first step", catch=WireTimeout):
            shapes, self.output_spec = handshake(self.wire, self.schedule, ranks, self.me, self.chunks,
                                                 self.all_bounds, x, labels, self.topo.world_size)
        self.p2p = PointToPoint(self.wire, ranks, shapes)
