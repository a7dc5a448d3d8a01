"""A rank's whole training step as one compiled graph, generated from its action list.

The engine's loop (pipe.core.engine) makes one compiled call per F, B, I or W and one wire call per
message; each costs the host 0.2-0.5 ms whatever the work (docs/benchmarks.md), which
bounds small models and deep pipelines. `StepGraph` walks the same lowered list once,
while MindSpore compiles: each action becomes the chunk's own compiled cell (pipe.chunk),
inlined, and each message the wire's in-graph operator (`graph_op`). The
messages keep the list's order because each takes a token from the one before
(`ops.depend`); the list's order is deadlock-free (pipe.simulator), so the graph is too.
One call then runs the step: F, B, I, W and messages, the gradients summed per chunk, and,
when nothing has to be summed with other ranks first (one replica, no tied weights, no
clipping by the global norm), the optimizer's update too.

Dropout masks are drawn on the host as the loop draws them (pipe.dropout) and go in with
the micro-batches. What needs the host between actions is refused: layers with buffers
(batch norm's statistics are put back after each backward) and recomputation.
Per-action traces and the watchdog's action position need the loop too.
"""
import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.core.engine import as_tensor, loss_share
from pipe.core.schedule import message_key, message_tag
from pipe.core.wire import MindSporeWire
from pipe.schedules import EVERY

__all__ = ["StepGraph", "check_supported", "refuse_tuples", "updates_in_graph", "encode",
           "replica_rows"]

F, B, I, W, SEND, RECV = range(6)
CODES = {"F": F, "B": B, "I": I, "W": W, "sF": SEND, "sB": SEND, "rF": RECV, "rB": RECV}


def check_supported(config, buffers):
    """Refuse, with the reason, what the step graph cannot run exactly (`buffers`: the
    model's, or this rank's layers')."""
    if config.recompute:
        raise ValueError("one_graph cannot recompute activations (the backward's second forward "
                         "is not in the graph); turn recompute or one_graph off")
    if buffers:
        raise ValueError("one_graph cannot run layers with buffers (batch norm): their statistics "
                         "are restored on the host after each backward; turn one_graph off")


def refuse_tuples(config, tuples):
    """The graph's messages carry one tensor each; `tuples`: a layer hands on a tuple."""
    if tuples and config.one_graph:
        raise ValueError("one_graph sends one tensor between stages, and a layer at a stage "
                         "boundary returns a tuple: turn one_graph off (the loop carries tuples)")


def encode(schedule, stage):
    """Each action of `stage`'s lowered list as constant integers, what the graph branches
    on while it is compiled: (code, micro-batch (EVERY: a W deferred to the flush), chunk,
    takes, puts, index). `takes` and `puts` are the tensors in flight an action reads and
    writes, by their message key as an integer (its wire tag; -1: the micro-batch's input,
    the loss gradient, or nothing); `index` is a message's place in the stage's messages,
    or for a computation 1 when it starts its chunk's gradient sum (a B or a W)."""
    program, started, message, V = [], set(), 0, schedule.virtual_stages
    for action in schedule.actions[stage]:
        code, mb, c = CODES[action.kind], action.mb, action.chunk
        if code in (SEND, RECV):
            program.append((code, mb, c, action.tag, -1, message))
            message += 1
            continue
        takes = puts = -1
        if code != W:
            vs = schedule.virtual_stage(stage, c)
            kind, to = ("F", vs + 1) if code == F else ("B", vs - 1)
            if (code == F and vs > 0) or (code != F and vs < V - 1):
                takes = message_tag(message_key(schedule, stage, action), V)
            if 0 <= to < V:          # for the next virtual stage: here, or a send
                puts = message_tag((kind, mb, to), V)
        sums = code in (B, W)
        program.append((code, mb, c, takes, puts, int(sums and c not in started)))
        if sums:
            started.add(c)
    return tuple(program)


def graph_op(p2p, action):
    """The operator that carries a send or receive `action` inside a compiled graph: on GPU
    and Ascend MindSpore's own (a Receive's optional input, a token, orders it); on CPU, which
    has no Send kernel, mpi4py called from a pyfunc operator, returning a token."""
    wire, peer = p2p.wire, p2p.ranks[action.peer]
    shape, dtype = p2p.shapes[action.boundary]
    if isinstance(wire, MindSporeWire):
        if action.kind[0] == "s":
            return ops.Send(action.tag, peer, group=wire.world)
        return ops.Receive(action.tag, peer, list(shape), dtype, group=wire.world)
    if action.kind[0] == "s":
        def send(x):
            wire.send_array(x, peer, action.tag)
            return np.zeros((1,), np.float32)
        return ops.Custom(send, out_shape=lambda x: (1,), out_dtype=lambda x: ms.float32,
                          func_type="pyfunc")

    def recv(token):
        return wire.recv_array(shape, dtype, peer, action.tag)
    return ops.Custom(recv, out_shape=lambda token: tuple(shape), out_dtype=lambda token: dtype,
                      func_type="pyfunc")


def replica_rows(batch):
    """This replica's (inputs, labels), uncut: the graph cuts them inside (no operator per
    micro-batch on the host)."""
    mine = slice(batch.cut[0].start, batch.cut[-1].stop)
    return tuple(as_tensor(a if mine == slice(0, len(a)) else a[mine]) for a in batch.source)


def _pick(tensors, positions):
    """tensors[i] for each i of `positions`, as a loop the graph compiler unrolls."""
    picked = ()
    for i in positions:
        picked = picked + (tensors[i],)
    return picked


def _rows(waiting):
    """W's tensors from the `waiting` entries of one or more micro-batches: with several (a W
    deferred to the flush) each tensor holds the rows of all of them, in micro-batch order,
    as in Chunk.backward_weight."""
    if len(waiting) == 1:
        return waiting[0]
    rows = ()
    for i in range(len(waiting[0])):
        parts = ()
        for entry in waiting:
            parts = parts + (entry[i],)
        rows = rows + (ops.cat(parts),)
    return rows


def updates_in_graph(layout):
    """Whether the optimizer can step inside the graph: its gradients are final there, with
    no all-reduce (over replicas, tied copies, the global norm or fp16's overflow flag) or
    sum of a weight two chunks hold between."""
    config = layout.config
    return (config.data_parallel == 1 and not layout.tied and not layout.repeats
            and not config.clip_grad_norm and config.precision == "fp32")


class StepGraph(nn.Cell):
    """(the replica's inputs, its labels, the dropout masks of each micro-batch and chunk,
    micro-batch first, the loss gradient's scale) -> (this rank's share of the step's loss
    (pipe.core.engine.loss_share), the summed weight gradients of each of its chunks, a token set
    once its work and messages are done). Given `update` (the optimizer over the chunks'
    parameters, in order), it steps too, and hands back no gradients (the small MLP's 18
    cost 75-110 us of host per call on one H200)."""

    def __init__(self, layout, p2p, update=None):
        """`layout` passed `check_supported` (pipe.layout checks it before any message)."""
        super().__init__(auto_prefix=False)
        chunks = layout.chunks
        for chunk in chunks:
            chunk.set_mode(True)
        self.forwards = nn.CellList([c.forward_cell for c in chunks])
        self.backwards = nn.CellList([c.backward_cell for c in chunks])
        self.input_grads = nn.CellList([c.input_grad_cell for c in chunks])
        self.weight_grads = nn.CellList([c.weight_grad_cell for c in chunks])
        self.weight_inputs = tuple(c.weight_grad_cell.inputs for c in chunks)
        self.no_labels = chunks[0].no_labels
        self.last = tuple(c.is_last for c in chunks)
        self.count = len(chunks)
        actions = layout.schedule.actions[layout.stage]
        self.messages = tuple(graph_op(p2p, a) for a in actions if not a.is_compute)
        self.program = encode(layout.schedule, layout.stage)
        self.token = ms.Tensor(0.0, ms.float32)
        self.update = update
        self.micro_batches = layout.config.micro_batches

    @ms.jit
    def construct(self, rows, labels_of_rows, masks, scale):
        size = rows.shape[0] // self.micro_batches
        inputs, labels = ops.split(rows, size), ops.split(labels_of_rows, size)
        flight, residuals, starts, waiting, grads = {}, {}, {}, {}, {}
        losses = ()
        # Two chains keep the list's order: `sent` through the messages, `done` through the
        # computations (else the compiler may run a W before the B a peer waits for). A
        # message waits only for its data, and a computation only for the one before it and
        # its data: a send in flight holds no computation back.
        sent, done = self.token, self.token
        for code, mb, c, takes, puts, index in self.program:
            unit = mb * self.count + c          # this micro-batch on chunk c
            if code == SEND:
                sent = ops.depend(sent, self.messages[index](ops.depend(flight[takes], sent)))
            elif code == RECV:
                flight[takes] = self.messages[index](sent)
                sent = ops.depend(sent, flight[takes])
            elif code == F:
                x = ops.depend(inputs[mb] if takes < 0 else flight[takes], done)
                y = labels[mb] if self.last[c] else self.no_labels
                out, residuals[unit] = self.forwards[c](x, y, scale, masks[unit])
                done = ops.depend(done, out)
                if self.last[c]:
                    losses = losses + (out[0],)
                    starts[unit] = out[1]
                else:
                    flight[puts] = out
            elif code == I:
                dy = ops.depend(starts[unit] if takes < 0 else flight[takes], done)
                dx, stashed = self.input_grads[c](dy, *residuals[unit])
                waiting[unit] = _pick(residuals[unit], self.weight_inputs[c]) + stashed
                done = ops.depend(ops.depend(done, stashed), dx)
                if puts >= 0:
                    flight[puts] = dx
            elif code == B:
                dy = ops.depend(starts[unit] if takes < 0 else flight[takes], done)
                dx, grads[c] = self.backwards[c](dy, () if index else grads[c], *residuals[unit])
                done = ops.depend(ops.depend(done, grads[c]), dx)
                if puts >= 0:
                    flight[puts] = dx
            else:
                entries = ()
                for m in (range(self.micro_batches) if mb == EVERY else (mb,)):
                    entries = entries + (waiting[m * self.count + c],)
                tensors = _rows(entries)
                tensors = (ops.depend(tensors[0], done),) + tensors[1:]
                grads[c] = self.weight_grads[c](() if index else grads[c], *tensors)
                done = ops.depend(done, grads[c])
        summed, flat = (), ()
        for c in range(self.count):
            summed, flat = summed + (grads[c],), flat + grads[c]
        if self.update is not None:   # stepped here: no gradient need leave the graph
            done, summed = ops.depend(done, self.update(flat)), ()
        return loss_share(losses, self.micro_batches), summed, ops.depend(sent, done)
