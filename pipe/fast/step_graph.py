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

__all__ = ["StepGraph", "updates_in_graph", "replica_rows"]


def replica_rows(batch):
    """This replica's (inputs, labels), uncut: the graph cuts them."""
    # (np.shape: a Tensor's len is an operator)
    mine = slice(batch.cut[0].start, batch.cut[-1].stop)
    return tuple(as_tensor(a if mine == slice(0, np.shape(a)[0]) else a[mine])
                 for a in batch.source)


def updates_in_graph(layout):
    """Whether the optimizer can step inside the graph: no all-reduce or sum of copies
    between its gradients and the update."""
    config = layout.config
    alone = config.stages * config.data_parallel == 1
    return (config.data_parallel == 1 and not layout.tied and not layout.repeats
            and not config.clip_grad_norm and (config.precision == "fp32" or alone))


class StepGraph(nn.Cell):
    """(the replica's inputs, its labels, the dropout masks, the loss gradient's scale, 1 / S,
    the global batch's labels) -> (this rank's losses summed, each chunk's summed weight
    gradients, a token set once its messages are done, 1.0 if a gradient overflowed, the
    global batch's count); `()` in or out where this graph has no use for it.

    Given `counter` (a (sum, count) loss) it counts first; given `update` it steps too, and
    given `unscale` (fp16 on one rank) only if nothing overflowed, as MindSpore's
    TrainOneStepWithLossScaleCell does, the update a statement nothing reads."""

    def __init__(self, actions, update=None, unscale=None, counter=None):
        super().__init__(auto_prefix=False)
        self.actions, self.update, self.unscale, self.counter = actions, update, unscale, counter
        self.micro_batches = actions.micro_batches
        self.sends = len(actions.messages) > 0
        self.executor = executor(self)   # (called as pipe.compiled says)

    def __call__(self, *inputs):
        return self.executor(*inputs)

    def construct(self, rows, labels_of_rows, masks, scale, inverse, labels):
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
        return losses, summed, sent, overflow, count

    def prepare(self, *inputs):
        """Compile the step for these inputs without running it (the executor's `compile`, what
        a `jit` call does first)."""
        self.executor.compile("run", *inputs)

    def cut(self, rows):
        """The replica's rows as its micro-batches (one: the rows themselves, no operator)."""
        if self.micro_batches == 1:
            return (rows,)
        return ops.split(rows, rows.shape[0] // self.micro_batches)
