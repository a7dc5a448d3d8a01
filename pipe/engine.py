"""The pipeline engine: executes this rank's schedule, then reduces gradients and steps.

    engine = PipelineEngine(model, loss_fn, make_optimizer, PipelineConfig(stages=2, ...))
    loss = engine.train_step(inputs, labels)    # the global mini-batch, same on every rank

Every rank builds the same full model (same seed), keeps its stage's layers, and walks its
list of schedule actions: F, B, and the sends/receives between them. The engine itself
decides nothing about order; `pipe.schedule` does.
"""
from dataclasses import dataclass
from typing import Union

import mindspore as ms
import numpy as np
from mindspore import ops

from pipe import checkpoint
from pipe.comm import PointToPoint, connect
from pipe.partition import partition, stage_bounds
from pipe.simulator import checked_schedule
from pipe.stage import Stage
from pipe.topology import Topology

__all__ = ["PipelineConfig", "PipelineEngine"]


@dataclass
class PipelineConfig:
    stages: int = 1                      # P: pipeline depth, one stage per rank
    data_parallel: int = 1               # D: pipeline replicas, each fed B/D samples
    micro_batches: int = 1               # M: micro-batches per replica per step
    batch_size: int = 1                  # B: global mini-batch per step
    schedule: str = "1f1b"               # a name from pipe.schedule.SCHEDULES
    partition: Union[str, list] = "uniform"  # "uniform", "parameters" or layer counts per stage
    device: str = "CPU"                  # MindSpore device target: CPU, GPU or Ascend
    timeout: float = 300.0               # seconds a send/receive may wait without progress

    def check(self):
        """Every mistake that can be found without talking to another rank."""
        for name in ("stages", "data_parallel", "micro_batches", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        per_step = self.data_parallel * self.micro_batches
        if self.batch_size % per_step:
            raise ValueError(
                f"batch size {self.batch_size} cannot be split over {self.data_parallel} "
                f"data-parallel replicas x {self.micro_batches} micro-batches: it must be a "
                f"multiple of {per_step}; try --batch-size "
                f"{max(per_step, self.batch_size // per_step * per_step)}")


class PipelineEngine:
    """Runs one rank's share of pipeline-parallel training."""

    def __init__(self, model, loss_fn, make_optimizer, config: PipelineConfig, wire=None):
        config.check()
        self.config = config
        self.topo = Topology(config.stages, config.data_parallel)
        self.wire = wire or connect(config.device, config.timeout)
        self.topo.check_world_size(self.wire.size)
        rank = self.wire.rank
        self.me, self.replica = self.topo.stage_of(rank), self.topo.replica_of(rank)
        self.schedule = checked_schedule(config.schedule, config.stages, config.micro_batches)
        self.bounds = stage_bounds(model, config.stages, config.partition)
        self.layers, self.param_names = partition(model, config.stages, self.me, config.partition)
        scale = 1.0 / (config.micro_batches * config.data_parallel)
        self.stage = Stage(self.layers, loss_fn if self.me == config.stages - 1 else None,
                           is_first=self.me == 0, grad_scale=scale)
        self.optimizer = make_optimizer(self.stage.params)
        self.p2p = None                  # set by the shape handshake before the first step
        self._inbox, self._outbox, self._losses = {}, {}, []
        self._run = {"F": self._forward, "B": self._backward, "sF": self._send_forward,
                     "rF": self._recv_forward, "sB": self._send_backward, "rB": self._recv_backward}

    # ---- one training step ------------------------------------------------------------
    def train_step(self, inputs, labels):
        """One optimizer step on the global mini-batch; returns its mean loss on every rank."""
        inputs, labels = self._micro_batches(inputs, labels)
        if self.p2p is None:
            self._handshake(inputs[0], labels[0])
        self.stage.zero_grads()
        self._losses = []
        for action in self.schedule.actions[self.me]:   # forward / backward, with messages
            self._run[action.kind](action, inputs, labels)
        grads = self._all_reduce_grads(self.stage.grads)  # data-parallel replicas agree
        self.optimizer(grads)                             # update
        return self._step_loss()

    def _micro_batches(self, inputs, labels):
        """This replica's rows of the global batch, cut into M micro-batches."""
        if len(inputs) != self.config.batch_size or len(labels) != len(inputs):
            raise ValueError(f"train_step got {len(inputs)} inputs and {len(labels)} labels; "
                             f"the configured global batch size is {self.config.batch_size}")
        per_replica = self.config.batch_size // self.config.data_parallel
        size = per_replica // self.config.micro_batches
        start = self.replica * per_replica
        cut = [slice(start + m * size, start + (m + 1) * size) for m in range(self.config.micro_batches)]
        as_tensor = lambda a: a if isinstance(a, ms.Tensor) else ms.Tensor(np.asarray(a))
        return [as_tensor(inputs[c]) for c in cut], [as_tensor(labels[c]) for c in cut]

    def _forward(self, action, inputs, labels):
        x = inputs[action.mb] if self.me == 0 else self._inbox.pop(("F", action.mb))
        out = self.stage.forward(action.mb, x, labels[action.mb] if self.stage.is_last else None)
        if self.stage.is_last:
            self._losses.append(out)
        else:
            self._outbox[("F", action.mb)] = out

    def _backward(self, action, inputs, labels):
        dy = None if self.stage.is_last else self._inbox.pop(("B", action.mb))
        dx = self.stage.backward(action.mb, dy)
        if self.me > 0:
            self._outbox[("B", action.mb)] = dx

    def _send_forward(self, action, *_):
        self.p2p.send_forward(self._outbox.pop(("F", action.mb)), action)

    def _recv_forward(self, action, *_):
        self._inbox[("F", action.mb)] = self.p2p.recv_forward(action)

    def _send_backward(self, action, *_):
        self.p2p.send_backward(self._outbox.pop(("B", action.mb)), action)

    def _recv_backward(self, action, *_):
        self._inbox[("B", action.mb)] = self.p2p.recv_backward(action)

    def _all_reduce_grads(self, grads):
        """Sum this stage's gradients over the replicas, as one flat buffer (one message)."""
        if self.config.data_parallel == 1:
            return grads
        flat = ops.cat([g.reshape(-1) for g in grads])
        flat = self.wire.all_reduce(flat, self.topo.data_parallel_ranks(self.me))
        sizes = [g.size for g in grads]
        return tuple(part.reshape(g.shape) for part, g in zip(ops.split(flat, sizes), grads))

    def _step_loss(self):
        """The last stages hold the loss; one world all-reduce gives it to every rank."""
        mine = sum(float(l.asnumpy()) for l in self._losses) / self.config.micro_batches
        total = self.wire.all_reduce(ms.Tensor([mine], ms.float32), tuple(range(self.topo.world_size)))
        return float(total.asnumpy()[0]) / self.config.data_parallel

    def save(self, directory):
        """Write this stage's parameters (replica 0 only), then, on rank 0 once every stage is
        on disk, merge them into `directory/model.ckpt`."""
        if self.replica == 0:
            checkpoint.save_stage(directory, self.me, self.param_names, self.stage.params)
        self.barrier()
        if self.wire.rank == 0:
            checkpoint.merge(directory)
        self.barrier()

    def barrier(self):
        self.wire.all_reduce(ms.Tensor([0], ms.int32), tuple(range(self.topo.world_size))).asnumpy()

    # ---- before the first step: agree on the shapes that cross each stage boundary ----
    def _handshake(self, x, labels):
        """Walk the pipeline once: each stage learns its input shape from the previous one,
        runs its forward on zeros (compiling it), and tells the next stage its output shape.
        Receives then never guess a shape. If a stage cannot take its input, every rank
        fails with the reason before any real message is sent."""
        ranks = self.topo.pipeline_ranks(self.replica)
        spec_in, error = (tuple(x.shape), x.dtype), ""
        if self.me > 0:
            spec_in = _read_header(self.wire.recv((_HEADER,), ms.int32, ranks[self.me - 1], _HANDSHAKE_TAG))
            error = "" if spec_in else f"stage {self.me - 1} or one before it failed its shape check"
        spec_out = None
        if not error:
            try:
                spec_out = self.stage.probe(ops.zeros(*spec_in), labels)
            except (ValueError, TypeError, RuntimeError) as e:
                first = self.bounds[self.me][0]
                error = (f"stage {self.me} cannot take the activation of shape {spec_in[0]} "
                         f"{spec_in[1]} that stage {self.me - 1} sends across the boundary "
                         f"between layers {first - 1} and {first}: {str(e).strip().splitlines()[0]}")
        if not self.stage.is_last:
            self.wire.send(_write_header(None if error else spec_out), ranks[self.me + 1], _HANDSHAKE_TAG)
        failed = np.zeros(self.topo.world_size, np.int32)
        failed[self.wire.rank] = bool(error)
        failed = self.wire.all_reduce(ms.Tensor(failed), tuple(range(self.topo.world_size))).asnumpy()
        if failed.any():
            raise RuntimeError(error or f"the shape check failed on rank(s) "
                               f"{np.flatnonzero(failed).tolist()}: see their messages")
        shapes = {self.me: spec_in, self.me + 1: spec_out}
        self.p2p = PointToPoint(self.wire, self.schedule, ranks, self.me, shapes)


_HANDSHAKE_TAG = 32000                 # above every micro-batch message's tag
_HEADER = 8                            # int32s: rank of the shape, dtype index, dims...
_DTYPES = [ms.float32, ms.float16, ms.bfloat16, ms.float64, ms.int32, ms.int64]


def _write_header(spec):
    """(shape, dtype) as a fixed-size int32 tensor; None (an upstream failure) as -1s."""
    header = np.full(_HEADER, -1, np.int32)
    if spec is not None:
        shape, dtype = spec
        header[:2 + len(shape)] = [len(shape), _DTYPES.index(dtype), *shape]
    return ms.Tensor(header)


def _read_header(tensor):
    header = tensor.asnumpy()
    if header[0] < 0:
        return None
    return tuple(int(d) for d in header[2:2 + header[0]]), _DTYPES[int(header[1])]
