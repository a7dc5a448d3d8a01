"""A rank's whole training step as one compiled graph, generated from its action list.

The engine's loop (pipe.core.engine) makes one compiled call per F, B, I or W and one wire call per
message; each costs the host 0.2-0.5 ms whatever the work (benchmarks/log.md), which
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

from pipe.core.engine import as_tensor
from pipe.normalized_loss import loss_sum
from pipe.core.schedule import message_key, message_tag
from pipe.core.wire import MindSporeWire, Parts, carrier, elements, travels
from pipe.schedules import EVERY
from pipe.split_backward import rows_of

__all__ = ["StepGraph", "check_supported", "updates_in_graph", "encode", "replica_rows"]

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


def wire_op(p2p, action, shape, dtype):
    """The operator that carries one tensor of a send or receive `action` inside a compiled
    graph: on GPU and Ascend MindSpore's own (a Receive's optional input, a token, orders
    it); on CPU, which has no Send kernel, mpi4py called from a pyfunc operator, returning
    a token."""
    wire, peer = p2p.wire, p2p.ranks[action.peer]
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


class Message(nn.Cell):
    """A send or receive inside the graph, as PointToPoint does it in the loop: a tuple as a
    message per element that `travels`, each as its `carrier`; zeros for a gradient that
    does not. Each operator waits for the token of the one before."""

    def __init__(self, p2p, action):
        super().__init__(auto_prefix=False)
        spec = p2p.specs[action.boundary]
        self.specs, self.is_tuple = tuple(elements(spec)), isinstance(spec, Parts)
        self.travels = tuple(travels(action.kind, dtype) for _, dtype in self.specs)
        self.carriers = tuple(carrier(dtype) for _, dtype in self.specs)
        self.wire_ops = tuple(wire_op(p2p, action, shape, carrier(dtype)) if go else None
                              for (shape, dtype), go in zip(self.specs, self.travels))

    def send(self, value, token):
        """Sends `value` once `token` is set; returns a token set once it is sent."""
        parts = value if self.is_tuple else (value,)
        for i in range(len(parts)):
            if self.travels[i]:
                part = parts[i] if parts[i].dtype == self.carriers[i] else parts[i].astype(self.carriers[i])
                token = ops.depend(token, self.wire_ops[i](ops.depend(part, token)))
        return token

    def recv(self, token):
        """The value received once `token` is set."""
        got = ()
        for i in range(len(self.specs)):
            shape, dtype = self.specs[i]
            if self.travels[i]:
                part = self.wire_ops[i](token)
                token = ops.depend(token, part)
                got = got + ((part if dtype == self.carriers[i] else part.astype(dtype)),)
            else:
                got = got + (ops.zeros(shape, dtype),)
        return got if self.is_tuple else got[0]


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


def updates_in_graph(layout):
    """Whether the optimizer can step inside the graph: its gradients are final there, with
    no all-reduce (over replicas, tied copies, the global norm, or fp16's overflow flag
    unless this is the only rank) or sum of a weight two chunks hold between."""
    config = layout.config
    alone = config.stages * config.data_parallel == 1
    return (config.data_parallel == 1 and not layout.tied and not layout.repeats
            and not config.clip_grad_norm and (config.precision == "fp32" or alone))


class StepGraph(nn.Cell):
    """(the replica's inputs, its labels, the dropout masks of each micro-batch and chunk,
    micro-batch first, the loss gradient's scale, 1 / S) -> (this rank's micro-batch losses
    summed (pipe.normalized_loss.loss_sum), the summed weight gradients of each of its
    chunks, a token set once its work and messages are done, 1.0 if a gradient overflowed
    else 0.0). Given `update` (the optimizer over the chunks' parameters, in order), it
    steps too, and hands back no gradients (the small MLP's 18 cost 75-110 us of host per
    call on one H200); given `unscale` too (fp16 on one rank: pipe.precision.Unscale), the
    gradients are divided by S first and the step is taken only if none overflowed, as
    MindSpore's TrainOneStepWithLossScaleCell does.

    With other ranks, the engine first compiles it once more (`Cell.compile`, which runs
    nothing) on every rank at once (pipe.handshake.agreed): a graph that fails to compile on
    one rank is refused on all before any of them waits on a message. (Running it through
    `compile_and_run` would save that second compile, but costs ~0.6 ms of host per step
    on one H200: the small MLP's step went from 2.3 to 2.9 ms.)"""

    def __init__(self, layout, p2p, update=None, unscale=None):
        """`layout` passed `check_supported` (pipe.layout checks it before any message)."""
        super().__init__(auto_prefix=False)
        self.unscale = unscale
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
        self.messages = nn.CellList([Message(p2p, a) for a in actions if not a.is_compute])
        self.program = encode(layout.schedule, layout.stage)
        self.token = ms.Tensor(0.0, ms.float32)
        self.update = update
        self.micro_batches = layout.config.micro_batches

    @ms.jit
    def construct(self, rows, labels_of_rows, masks, scale, inverse):
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
                sent = self.messages[index].send(flight[takes], sent)
            elif code == RECV:
                flight[takes] = self.messages[index].recv(sent)
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
                tensors = rows_of(entries)
                tensors = (ops.depend(tensors[0], done),) + tensors[1:]
                grads[c] = self.weight_grads[c](() if index else grads[c], *tensors)
                done = ops.depend(done, grads[c])
        summed, flat = (), ()
        for c in range(self.count):
            summed, flat = summed + (grads[c],), flat + grads[c]
        overflow = ops.zeros(1, ms.float32)
        if self.update is not None:   # stepped here: no gradient need leave the graph
            summed = ()
            if self.unscale is None:
                done = ops.depend(done, self.update(flat))
            else:
                flat, overflow = self.unscale(flat, inverse)
                if overflow[0] < 0.5:
                    done = ops.depend(done, self.update(flat))
        return loss_sum(losses), summed, ops.depend(sent, done), overflow
