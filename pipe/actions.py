"""A rank's actions, each handler written once: run one by one, or traced into one graph.

    state = actions.run_all(actions.start(), data)   # pipe.step: as Python (the loop, each
                                                     # action watched) or compiled, one call

One by one, a handler calls its chunk's compiled cells and the wire; traced, MindSpore
compiles the same lines once per batch shape (the program is constants) with messages as
in-graph operators. `state` is a dict (MindSpore's graphs update a dict in place, not a
tuple's fields): `flight`, the tensors between chunks by wire tag; `kept` and
`waiting`, what a backward piece and W read; `grads`, each chunk's sums; `outputs`, the
losses; `done`, the token that keeps a graph's work in the list's order."""
from dataclasses import replace

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.layers import variable, with_sums
from pipe.schedule import message_key, message_tag
from pipe.schedules import EVERY
from pipe.wire import MindSporeWire, Parts, carrier, elements, travels

__all__ = ["Actions", "Loop", "KeepResiduals", "encode", "take"]


def encode(schedule, stage):
    """`stage`'s lowered list, each action given what its handler reads: the tensors in
    flight it takes and puts, named by their wire tags, a message's index, a sum's start."""
    program, started, message, V = [], set(), 0, schedule.virtual_stages
    for action in schedule.actions[stage]:
        if not action.is_compute:
            held = {"takes": action.tag} if action.kind[0] == "s" else {"puts": action.tag}
            program.append(replace(action, message=message, **held))
            message += 1
            continue
        takes = puts = None
        if action.kind != "W":
            vs = schedule.virtual_stage(stage, action.chunk)
            forward = action.kind == "F"
            hands, to = ("F", vs + 1) if forward else ("B", vs - 1)
            if (forward and vs > 0) or (not forward and vs < V - 1):
                takes = message_tag(message_key(schedule, stage, action), V)
            if 0 <= to < V:          # for the next virtual stage: here, or a send
                puts = message_tag((hands, action.mb, to), V)
        sums = action.kind in ("B", "W") and action.chunk not in started
        program.append(replace(action, takes=takes, puts=puts, starts_sum=sums))
        if action.kind in ("B", "W"):
            started.add(action.chunk)
    return tuple(program)


def take(store, key):
    """`store[key]`, released: one by one, a tensor is freed once its last reader took it."""
    value = store[key]
    store[key] = None
    return value


def first(value, after):
    """The loop's `order`: each call has returned before the next starts."""
    return value


def variables(values):
    """Each value as a compiled cell takes it (a tuple: mutable, not a constant)."""
    return tuple([variable(value) for value in values])


class KeepResiduals(nn.Cell):
    """What F keeps for its backward pieces: the residuals and, on the model's last chunk,
    the loss gradient (pipe.features.recompute.Recompute keeps the input instead)."""

    def kept(self, x, labels, extras, out, residuals, is_last):
        return residuals, out[1] if is_last else None

    def restored(self, forward, kept, scale, is_last):
        return kept


class Actions(nn.Cell):
    """The handlers of one rank's actions (`program`) over the chunks of `layout` and the
    messages of `p2p`; `compiled`: built to be traced (messages as operators, work ordered by
    tokens). `data` is (inputs, labels, each micro-batch and chunk's extras for the forward
    (what a feature adds to its input: dropout's masks), the loss gradient's scale)."""

    def __init__(self, layout, p2p, compiled):
        super().__init__(auto_prefix=False)
        chunks = layout.chunks

        def each(cell_of):            # (auto_prefix off: parameters keep whole-model names)
            return nn.CellList([cell_of(c) for c in chunks], auto_prefix=False)
        self.forwards = each(lambda c: c.forward_cell)
        self.backwards = each(lambda c: c.backward_cell)
        self.input_grads = each(lambda c: c.input_grad_cell)
        self.weight_grads = each(lambda c: c.weight_grad_cell)
        self.weight_inputs = tuple(c.weight_inputs for c in chunks)
        self.last = tuple(c.is_last for c in chunks)
        self.count = len(chunks)
        self.no_labels = chunks[0].no_labels
        self.keep = layout.keep          # what F keeps for the backward (KeepResiduals)
        self.micro_batches = layout.config.micro_batches
        actions = layout.schedule.actions[layout.stage]
        messages = [Message(p2p, a, compiled) for a in actions if not a.is_compute]
        self.messages = nn.CellList(messages, auto_prefix=False)
        self.program = encode(layout.schedule, layout.stage)
        # In a graph, one token runs every action after the one before: the list's order, which
        # cannot deadlock and bounds the memory (unordered, a send ran after later work and the
        # next stage waited: docs/gpus.md). One micro-batch with no message has nothing to order.
        ordered = compiled and (len(self.messages) > 0 or self.micro_batches > 1)
        self.order = ops.depend if ordered else first
        self.token = ms.Tensor(0.0, ms.float32)

    def start(self, kept=None, waiting=None):
        """A step's state, nothing in flight; the loop gives the stores `kept` and `waiting`
        whose bytes it counts (pipe.ops.memory)."""
        return {"flight": {}, "kept": {} if kept is None else kept,
                "waiting": {} if waiting is None else waiting, "grads": {}, "outputs": (),
                "done": self.token}

    def run(self, state, step, data):
        """One action of `program` (encoded) on `state`; returns the state."""
        if step.kind == "F":
            return self.forward(state, step.mb, step.chunk, step.takes, step.puts, data)
        if step.kind in ("B", "I"):
            return self.backward(state, step.mb, step.chunk, step.takes, step.puts,
                                 step.starts_sum, data, step.kind == "B")
        if step.kind == "W":
            return self.weight_grad(state, step.mb, step.chunk, step.starts_sum)
        if step.kind[0] == "s":
            return self.send(state, step.message, step.takes)
        return self.recv(state, step.message, step.puts)

    def run_all(self, state, data):
        """Every action of `program`, in order, from `state`; returns the state."""
        for action in self.program:
            state = self.run(state, action, data)
        return state

    def summed(self, state):
        """The step's weight gradient sums, each chunk's after the one before, as one tuple."""
        summed = ()
        for c in range(self.count):
            summed = summed + state["grads"][c]
        return summed

    # ---- computations -----------------------------------------------------------------
    def forward(self, state, mb, c, takes, puts, data):
        """F: chunk c's forward of micro-batch mb on the batch's rows or on what arrived; its
        output handed on or, on the last chunk, its loss kept."""
        inputs, labels, extras, scale = data
        unit = mb * self.count + c               # this micro-batch on chunk c
        x = variable(self.order(self.arrived(state, inputs, mb, takes), state["done"]))
        y = labels[mb] if self.last[c] else self.no_labels
        out, residuals = self.forwards[c](x, y, scale, extras[unit])
        state["done"] = self.order(state["done"], out)
        state["kept"][unit] = self.keep.kept(x, y, extras[unit], out, residuals, self.last[c])
        return self.hand_on(state, c, puts, out, out[0] if self.last[c] else None)

    def arrived(self, state, inputs, mb, takes):
        """F's input: the batch's rows of micro-batch mb, or the tensor in flight `takes`."""
        return inputs[mb] if takes is None else take(state["flight"], takes)

    def hand_on(self, state, c, puts, out, output):
        """F's output `out` in flight for the next chunk, or on the model's last chunk
        `output` (its loss) among the step's outputs."""
        if self.last[c]:
            state["outputs"] = state["outputs"] + (output,)
        else:
            state["flight"][puts] = out
        return state

    def backward(self, state, mb, c, takes, puts, first_sum, data, whole):
        """B (`whole`): chunk c's backward of micro-batch mb, its weight gradients added to
        the chunk's sums; I: the input gradient only, what W will read left waiting. Either
        hands the input gradient on."""
        residuals, dy = self.restored(state, mb, c, takes, data)
        cell = self.backwards[c] if whole else self.input_grads[c]
        dx, given = cell(dy, *variables(residuals))
        if whole:
            state["grads"][c] = given = with_sums(state["grads"].get(c), given, first_sum)
        else:
            read = tuple([residuals[i] for i in self.weight_inputs[c]])      # what W reads
            state["waiting"][mb * self.count + c] = read + given
        state["done"] = self.order(self.order(state["done"], given), dx)
        if puts is not None:
            state["flight"][puts] = dx
        return state

    def weight_grad(self, state, mb, c, first_sum):
        """W: chunk c's weight gradients of micro-batch mb, or of all of them at the flush
        (EVERY: one product per layer), added to its sums."""
        entries = tuple([self.held(take(state["waiting"], m * self.count + c), state)
                         for m in (range(self.micro_batches) if mb is EVERY else (mb,))])
        grads = self.weight_grads[c](*variables(entries))
        state["grads"][c] = with_sums(state["grads"].get(c), grads, first_sum)
        state["done"] = self.order(state["done"], state["grads"][c])
        return state

    def held(self, entry, state):
        """What W reads of one micro-batch, each tensor once the action before is done. In a
        graph no product of W's starts earlier (each would start once its inputs are ready,
        ahead of the send the I before ends with, and the next stage would wait for W), and W
        shares no work with I: it computes what the loop's W does."""
        return tuple([self.order(tensor, state["done"]) for tensor in entry])

    def restored(self, state, mb, c, takes, data):
        """(the residuals, the output gradient) a backward piece starts from: what F kept, and
        the gradient that arrived or, on the last chunk, the loss gradient."""
        kept = take(state["kept"], mb * self.count + c)
        residuals, start = self.keep.restored(self.forwards[c], kept, data[3], self.last[c])
        dy = self.order(start if takes is None else take(state["flight"], takes), state["done"])
        return residuals, variable(dy)

    # ---- messages ---------------------------------------------------------------------
    def send(self, state, index, key):
        state["done"] = self.messages[index].send(take(state["flight"], key), state["done"])
        return state

    def recv(self, state, index, key):
        state["flight"][key] = self.messages[index].recv(state["done"])
        state["done"] = self.order(state["done"], state["flight"][key])
        return state


class Loop(Actions):
    """The handlers run one by one as Python, each inside `around(i)` (the engine's watch and
    trace of action i); `stores()`, if given, makes a step's `kept` and `waiting`."""

    def __init__(self, layout, p2p, stores, around):
        super().__init__(layout, p2p, compiled=False)
        self.stores, self.around = stores, around
        self.position = {id(step): i for i, step in enumerate(self.program)}

    def start(self, kept=None, waiting=None):
        return super().start(*self.stores()) if self.stores else super().start()

    def run(self, state, step, data):
        with self.around(self.position[id(step)]):
            return super().run(state, step, data)


def wire_op(p2p, action, shape, dtype, compiled):
    """What carries one tensor of a send or receive: one by one, the wire's call; in a graph,
    MindSpore's Send/Receive on GPU and Ascend, on CPU mpi4py in a pyfunc operator."""
    wire, peer, sends = p2p.wire, p2p.ranks[action.peer], action.kind[0] == "s"
    if not compiled:
        if sends:
            return lambda x: wire.send(x, peer, action.tag)
        return lambda token: wire.recv(shape, dtype, peer, action.tag)
    if isinstance(wire, MindSporeWire):
        if sends:
            return ops.Send(action.tag, peer, group=wire.world)
        return ops.Receive(action.tag, peer, list(shape), dtype, group=wire.world)
    if sends:
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
    """One send or receive: a tuple as one message per element that `travels` (as its
    `carrier`), zeros for a gradient that does not; each part after the one before."""

    def __init__(self, p2p, action, compiled):
        super().__init__(auto_prefix=False)
        spec = p2p.specs[action.boundary]
        self.specs, self.is_tuple = tuple(elements(spec)), isinstance(spec, Parts)
        self.travels = tuple(travels(action.kind, dtype) for _, dtype in self.specs)
        self.carriers = tuple(carrier(dtype) for _, dtype in self.specs)
        self.wire_ops = tuple(wire_op(p2p, action, shape, carrier(dtype), compiled) if go else None
                              for (shape, dtype), go in zip(self.specs, self.travels))
        self.order, self.in_graph = (ops.depend if compiled else first), compiled

    def send(self, value, token):
        """Sends `value` once `token` is set; returns a token set once it is sent."""
        parts = value if self.is_tuple else (value,)
        for i in range(len(parts)):
            if self.travels[i]:
                part = parts[i]
                if part.dtype != self.carriers[i]:
                    part = part.astype(self.carriers[i])
                token = self.order(token, self.wire_ops[i](self.order(part, token)))
        return token

    def recv(self, token):
        """The value received once `token` is set."""
        got = ()
        for i in range(len(self.specs)):
            shape, dtype = self.specs[i]
            if self.travels[i]:     # (in a graph the token is Receive's input: NCCL's kernel
                                    # takes it in the dtype it gives, an int32 mask's too)
                part = self.wire_ops[i](token.astype(self.carriers[i]) if self.in_graph else token)
                token = self.order(token, part)
                got = got + ((part if dtype == self.carriers[i] else part.astype(dtype)),)
            else:
                got = got + (ops.zeros(shape, dtype),)
        return got if self.is_tuple else got[0]
