"""A rank's whole training step as one compiled graph: its action handlers, traced.

The loop makes one compiled call per F, B, I or W and one wire call per message, each
costing the host a fraction of a millisecond whatever the work. `StepGraph` runs the very
handlers the loop runs (pipe.actions.Actions) inside one `jit` call: MindSpore traces them
once per batch shape, each message the wire's in-graph operator, ordered by a token from
the one before (the list's order is deadlock-free, so the graph is too). When nothing has
to be summed with other ranks first, the optimizer's update runs inside it too.
"""
import numpy as np
from mindspore import nn, ops

from pipe.batch import as_tensor
from pipe.compiled import executor
from pipe.features.token_loss import loss_sum

__all__ = ["StepGraph", "INPUTS", "OUTPUTS", "updates_in_graph", "replica_rows"]


def replica_rows(batch):
    """This replica's (inputs, labels), uncut: the graph cuts them inside (no operator per
    micro-batch on the host)."""
    # (np.shape: a Tensor's len is an operator)
    mine = slice(batch.cut[0].start, batch.cut[-1].stop)
    return tuple(as_tensor(a if mine == slice(0, np.shape(a)[0]) else a[mine])
                 for a in batch.source)


def updates_in_graph(layout):
    """Whether the optimizer can step inside the graph: its gradients are final there, with
    no all-reduce (over replicas, tied copies, the global norm, or fp16's overflow flag
    unless this is the only rank) or sum of a weight two chunks hold between."""
    config = layout.config
    alone = config.stages * config.data_parallel == 1
    return (config.data_parallel == 1 and not layout.tied and not layout.repeats
            and not config.clip_grad_norm and (config.precision == "fp32" or alone))


INPUTS = ("rows", "labels_of_rows", "masks", "scale", "inverse", "labels")
OUTPUTS = ("loss", "grads", "sent", "overflow", "count")


class StepGraph(nn.Cell):
    """(the replica's inputs, its labels, the dropout masks of each micro-batch and chunk,
    the loss gradient's scale, 1 / S, the global batch's labels) -> (this rank's losses
    summed, the summed weight gradients of each chunk, a token set once its messages are
    done, 1.0 if a gradient overflowed else 0.0, the global batch's count).

    Given `counter` (a (sum, count) loss), it counts first and divides the scale by the
    count. Given `update`, it steps too and hands back no gradients; given `unscale` too
    (fp16 on one rank), it divides by S first and steps only if nothing overflowed, as
    MindSpore's TrainOneStepWithLossScaleCell does. A call takes and gives only what this
    graph uses (`takes`, `gives`); `constants` it holds (the same every step).

    The update is a statement whose value nothing reads, as in MindSpore's own step, so
    each weight steps as soon as its gradient is final, freeing it. In fp16 the loss comes
    before the overflow check, where the host waits to read the flag.

    With other ranks the engine compiles it first on every rank at once (`prepare`): a
    graph that fails to compile on one rank is refused on all before any message."""

    def __init__(self, actions, update=None, unscale=None, counter=None, constants=None):
        """`actions`: the rank's handlers, built to be traced (pipe.actions.Actions);
        `counter`: a (sum, count) loss's pipe.features.token_loss.TokenCount; `constants`:
        {input name: its value every step}."""
        super().__init__(auto_prefix=False)
        self.actions, self.update, self.unscale, self.counter = actions, update, unscale, counter
        self.micro_batches = actions.micro_batches
        self.sends = len(actions.messages) > 0
        held = dict(constants or {})       # inputs the same every step, and those of no use
        if unscale is None:
            held["inverse"] = ()
        if counter is None:
            held["labels"] = ()
        self.takes = tuple(name for name in INPUTS if name not in held)
        # each input's place among a call's arguments, or -1 and the value the graph holds
        self.sources = tuple((self.takes.index(name), ()) if name in self.takes
                             else (-1, held[name]) for name in INPUTS)
        gives = {"grads": update is None, "sent": self.sends, "overflow": unscale is not None,
                 "count": counter is not None}
        self.given = tuple(gives.get(name, True) for name in OUTPUTS)      # (the loss always)
        self.executor = executor(self)   # (called as pipe.compiled says)

    @property
    def gives(self):
        """The names of what a call gives, in OUTPUTS' order."""
        return tuple(name for name, given in zip(OUTPUTS, self.given) if given)

    def call(self, *inputs):
        """A call of the step, given every input (INPUTS' order); every output (OUTPUTS'
        order), `()` for one this graph does not give."""
        outputs = iter(self.executor(*self.taken(inputs)))
        return tuple(next(outputs) if given else () for given in self.given)

    def taken(self, inputs):
        """Of every input (INPUTS' order), those a call takes."""
        return tuple(value for name, value in zip(INPUTS, inputs) if name in self.takes)

    def construct(self, *arguments):
        rows, labels_of_rows, masks, scale, inverse, labels = self.completed(arguments)
        count = ()
        if self.counter is not None:   # the global batch's count divides the scale first
            scale, count = self.counter(labels, scale)
        data = (self.cut(rows), self.cut(labels_of_rows), masks, scale)
        state = self.actions.start({}, {})
        for action in self.actions.program:
            state = self.actions.run(state, action, data)
        summed, losses = self.actions.summed(state), loss_sum(state["outputs"])
        sent = state["sent"] if self.sends else ()   # (nothing to wait for: no output)
        overflow = ()
        if self.update is not None:   # stepped here: no gradient need leave the graph
            flat = ()
            for grads in summed:
                flat = flat + grads
            summed = ()
            if self.unscale is None:
                self.update(flat)      # a statement, as in MindSpore's own step (see above)
            else:
                flat, overflow = self.unscale(flat, inverse)
                overflow = ops.depend(overflow, losses)   # the loss before the host reads the flag
                if overflow[0] < 0.5:      # (a bare statement here does not compile)
                    overflow = ops.depend(overflow, self.update(flat))
        return self.given_only((losses, summed, sent, overflow, count))

    def completed(self, arguments):
        """Every input (INPUTS' order): a call's argument, else what the graph holds (a loop
        the compiler unrolls: positions and constants are fixed)."""
        inputs = ()
        for position, held in self.sources:
            inputs = inputs + ((held,) if position < 0 else (arguments[position],))
        return inputs

    def given_only(self, outputs):
        """Of every output (OUTPUTS' order), those a call gives."""
        given = ()
        for value, gives in zip(outputs, self.given):
            if gives:
                given = given + (value,)
        return given

    def prepare(self, *inputs):
        """Compile the step for these inputs (every input, as `call` takes them) without
        running it; its first call with inputs of the same shapes then runs what this
        compiled. (MindSpore has no public call for this: `Cell.compile` builds another
        graph, GRAPH_MODE's, which a `jit` call does not use, so every first step compiled
        twice. This is what a `jit` call does before it runs: its executor's `compile`.)"""
        self.executor.compile("run", *self.taken(inputs))

    def cut(self, rows):
        """The replica's rows as its micro-batches (one: the rows themselves, no operator)."""
        if self.micro_batches == 1:
            return (rows,)
        return ops.split(rows, rows.shape[0] // self.micro_batches)
