"""The engine: one rank's share of a training step, executed from its schedule.

    engine = Engine(model, loss_fn, make_optimizer, Config(stages=2, micro_batches=4, ...))
    loss = engine.train_step(inputs, labels)   # the global mini-batch, the same on every rank

A step: cut the batch; run this stage's actions in the schedule's order, the chunks summing
weight gradients over micro-batches; sum them over the replicas; step.
"""
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.core.chunk import Chunk
from pipe.core.place import Topology
from pipe.core.schedule import HANDS_ON, gpipe, lower, message_key, one_f_one_b
from pipe.core.wire import HEADER, PointToPoint, connect, example, read_header, spec_of, write_header

__all__ = ["Engine", "MicroBatches", "split", "as_tensor", "sum_over", "loss_share"]


@dataclass
class MicroBatches:
    """A step's micro-batches: `cut`, each one's rows of `source` (inputs, labels)."""
    source: tuple
    cut: list
    outputs: list = field(default_factory=list)   # the last stage's losses (or outputs)

    @cached_property
    def inputs(self):
        return [as_tensor(self.source[0][c]) for c in self.cut]

    @cached_property
    def labels(self):
        return [as_tensor(self.source[1][c]) for c in self.cut]

    @cached_property
    def shapes(self):   # (inputs, labels) of one, read off `source`: cutting costs 2M operators
        return tuple((self.cut[0].stop - self.cut[0].start, *np.shape(a)[1:]) for a in self.source)


def as_tensor(array):
    return array if isinstance(array, ms.Tensor) else ms.Tensor(np.asarray(array))


def split(config, inputs, labels, replica):
    """Replica r's M micro-batches: rows [r B/D, (r+1) B/D) of the global batch, in M pieces."""
    M, D, n = config.micro_batches, config.data_parallel, len(inputs)
    if n != config.batch_size or len(labels) != n:
        raise ValueError(f"train_step got {n} inputs and {len(labels)} labels; "
                         f"batch_size={config.batch_size} is configured")
    size = config.batch_size // (D * M)
    return MicroBatches((inputs, labels), [slice((replica * M + m) * size, (replica * M + m + 1) * size)
                                           for m in range(M)])


class CompiledUpdate(nn.Cell):
    """The optimizer step as one compiled graph: op by op it costs more than the backward."""

    def __init__(self, optimizer):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    @ms.jit
    def construct(self, grads):
        return self.optimizer(grads)


def sum_over(wire, grads, ranks):
    """Each gradient summed over `ranks`, as one flat message."""
    if len(ranks) == 1 or not grads:
        return tuple(grads)
    flat = wire.all_reduce(ops.cat([g.reshape(-1) for g in grads]), ranks)
    return tuple(p.reshape(g.shape) for g, p in zip(grads, ops.split(flat, [g.size for g in grads])))


def loss_share(losses, micro_batches):
    """A rank's share of the step's mean loss: its micro-batches' losses / M (0 off the last stage)."""
    return (ops.stack(losses or [ops.zeros((), ms.float32)]).sum() / micro_batches).reshape(1)


class Engine:
    """One rank's share of training an nn.SequentialCell; `make_optimizer(params)`: its optimizer."""

    def __init__(self, model, loss_fn, make_optimizer, config, wire=None):
        config.check()
        self.config = config
        self.wire = wire or connect(config.device)
        self.topo = Topology(config.stages, config.data_parallel)
        self.topo.check_world_size(self.wire.size)
        self.stage, self.replica = self.topo.stage_of(self.wire.rank), self.topo.replica_of(self.wire.rank)
        self.schedule, self.chunks = self.build(model, loss_fn)
        params = list({id(p): p for chunk in self.chunks for p in chunk.params}.values())
        self.optimizer = make_optimizer(params)
        self.update = CompiledUpdate(self.optimizer)
        self.p2p = None                  # this rank's messages, once the stages agree on shapes
        self.step = 0                    # optimizer steps taken
        self.inbox, self.outbox = {}, {}  # tensors in flight, by message key
        self.handlers = {"F": self.forward, "B": self.backward, "sF": self.send, "sB": self.send,
                         "rF": self.recv, "rB": self.recv}

    def build(self, model, loss_fn):
        """The lowered schedule, and this rank's chunk: its stage's share of the layers."""
        P, M, D = self.config.stages, self.config.micro_batches, self.config.data_parallel
        schedule = lower({"gpipe": gpipe, "1f1b": one_f_one_b}[self.config.schedule](P, M))
        layers, s = list(model.cells()), self.stage
        first, last = len(layers) * s // P, len(layers) * (s + 1) // P
        return schedule, [Chunk(layers[first:last], loss_fn if s == P - 1 else None,
                                is_first=s == 0, grad_scale=1.0 / (M * D))]

    # ---- one training step ------------------------------------------------------------
    def train_step(self, inputs, labels):
        """One optimizer step on the global mini-batch; returns its mean loss on every rank."""
        batch = split(self.config, inputs, labels, self.replica)   # this replica's micro-batches
        self.step += 1
        if self.p2p is None:             # the first step: the stages agree on what they send
            self.p2p = self.connect_stages(batch)
        for chunk in self.chunks:
            chunk.zero_grads()
        # Backwards start at d loss/d logits x 1/(M x D); summing M x D gives the batch mean.
        self.execute(self.schedule, batch, self.handlers)
        grads = sum_over(self.wire, tuple(g for chunk in self.chunks for g in chunk.grads),
                         self.topo.data_parallel_ranks(self.stage))   # over the replicas
        self.update(ms.mutable(grads))
        share = loss_share(batch.outputs, self.config.micro_batches)  # 0 off the last stage
        world = tuple(range(self.wire.size))
        return float(self.wire.all_reduce(share, world).asnumpy()[0]) / self.config.data_parallel

    def execute(self, schedule, batch, handlers):
        """Run this stage's actions in order. This loop is the whole runtime."""
        for i, action in enumerate(schedule.actions[self.stage]):
            with self.around(schedule, i):
                handlers[action.kind](action, batch)

    def around(self, schedule, i):
        """Context of action i of this stage's list: nothing here (watch, trace)."""
        return nullcontext()

    # ---- the actions ------------------------------------------------------------------
    def forward(self, action, batch):
        chunk = self.chunks[action.chunk]
        self.hand_on(action, chunk.forward(action.mb, self.take(action, batch), batch.labels[action.mb]), batch)

    def backward(self, action, batch):
        self.hand_on(action, self.chunks[action.chunk].backward(action.mb, self.take(action, batch)), batch)

    def take(self, action, batch):
        """What `action` computes from: the input on virtual stage 0, else the one received or
        handed over (on the last, the backward's None: the loss starts it)."""
        key = message_key(self.schedule, self.stage, action)
        if action.kind == "F" and key[2] == 0:
            return batch.inputs[action.mb]
        return self.inbox.pop(key, None)

    def hand_on(self, action, tensor, batch):
        """To the next (after F) or previous virtual stage: inbox if held here, else outbox."""
        kind = HANDS_ON[action.kind]
        to = self.schedule.virtual_stage(self.stage, action.chunk) + (1 if kind == "F" else -1)
        if to == self.schedule.virtual_stages:
            batch.outputs.append(tensor)
        elif 0 <= to:
            box = self.inbox if self.schedule.holds(self.stage, to) else self.outbox
            box[(kind, action.mb, to)] = tensor

    def send(self, action, batch):
        self.p2p.send(self.outbox.pop(message_key(self.schedule, self.stage, action)), action)

    def recv(self, action, batch):
        self.inbox[message_key(self.schedule, self.stage, action)] = self.p2p.recv(action)

    # ---- before the first step --------------------------------------------------------
    def connect_stages(self, batch, probe=None):
        """Agree on what crosses each boundary: in virtual-stage order, a stage learns its input's
        spec, runs its forward on it and tells the next its output's (`probe`, or None)."""
        probe = probe or (lambda c, vs, spec: self.chunks[c].output_spec(
            example(spec), batch.labels[0]))
        s, schedule, ranks = self.stage, self.schedule, self.topo.pipeline_ranks(self.replica)
        x, specs = batch.inputs[0], {}
        for c in range(schedule.chunks_per_stage):
            vs = schedule.virtual_stage(s, c)
            if vs == 0:
                specs[vs] = spec_of(x)
            elif not schedule.holds(s, vs - 1):  # (held: this stage's own output)
                specs[vs] = read_header(self.wire.recv((HEADER,), ms.int32, ranks[
                    schedule.stage_of(vs - 1)], schedule.free_tag).asnumpy())
            specs[vs + 1] = None if specs[vs] is None else probe(c, vs, specs[vs])
            if vs + 1 < schedule.virtual_stages and not schedule.holds(s, vs + 1):
                self.wire.send(ms.Tensor(write_header(specs[vs + 1])),
                               ranks[schedule.stage_of(vs + 1)], schedule.free_tag)
        return PointToPoint(self.wire, ranks, specs)
