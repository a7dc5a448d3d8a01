"""A rank's whole training step as one compiled graph: its action handlers, traced.

The per-action loop makes one compiled call per F, B, I or W and one wire call per message;
each costs the host 0.2-0.5 ms whatever the work (benchmarks/log.md), which bounds small
models and deep pipelines. `StepGraph` runs the very handlers the loop runs
(pipe.actions.Actions) inside one `ms.jit`: MindSpore traces them once per batch shape,
each action's chunk cell inlined and each message the wire's in-graph operator. The
messages keep the list's order because each takes a token from the one before
(`ops.depend`); the list's order is deadlock-free (pipe.simulator), so the graph is too.
One call then runs the step: F, B, I, W and messages, the gradients summed per chunk, and,
when nothing has to be summed with other ranks first (one replica, no tied weights, no
clipping by the global norm), the optimizer's update too. Dropout masks are drawn on the
host as for the loop (pipe.dropout) and go in with the batch; batch norm's buffers are put
back after each backward piece inside the graph, as in the loop (pipe.batchnorm).
"""
import mindspore as ms
from mindspore import nn, ops
from mindspore.graph.api import _JitExecutor   # (StepGraph.prepare says why)

from pipe.core.engine import as_tensor
from pipe.normalized_loss import loss_sum

__all__ = ["StepGraph", "updates_in_graph", "replica_rows"]


def replica_rows(batch):
    """This replica's (inputs, labels), uncut: the graph cuts them inside (no operator per
    micro-batch on the host)."""
    mine = slice(batch.cut[0].start, batch.cut[-1].stop)
    return tuple(as_tensor(a if mine == slice(0, len(a)) else a[mine]) for a in batch.source)


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
    micro-batch first, the loss gradient's scale, 1 / S, the global batch's labels) ->
    (this rank's micro-batch losses summed (pipe.normalized_loss.loss_sum), the summed
    weight gradients of each of its chunks, a token set once its messages are done, 1.0 if
    a gradient overflowed else 0.0, the global batch's count). Given `counter` (a (sum,
    count) loss), the graph counts first and divides the scale by the count. Given `update`
    (the optimizer over the chunks' parameters, in order), it steps too, and hands back no
    gradients; given `unscale` too (fp16 on one rank: pipe.precision.Unscale), the
    gradients are divided by S first and the step is taken only if none overflowed, as
    MindSpore's TrainOneStepWithLossScaleCell does.

    What a call has no use for is `()`, in and out: 1 / S unless it unscales, the token
    unless the rank has messages, the overflow flag unless it unscales, the global labels
    and the count unless the loss is counted. Each tensor in or out costs the host time
    per call (~20 us on CPU: benchmarks/probes/call_cost.py), as much as a small model's
    operators.

    In fp32 the update is a statement whose value nothing reads, as in MindSpore's own step:
    MindSpore then runs each weight's update as soon as its gradient is final, which frees
    that gradient. (Tied to an output, it ran after the whole backward, which kept every
    gradient alive at once.) For the same reason the token returned is the messages' alone
    (`sent`), not the one that orders the work (`done`), which the last backward's gradients
    set. In fp16 every gradient is needed before the overflow check anyway, and the check is
    the one point where the host waits inside the graph (it reads the flag to take the
    branch): what the graph leaves until after it, the host launches only once the device
    is idle, so the step's loss is made to come before it (on one H200, its kernels ran
    after the optimizer's, one by one, at the GPT's fp16 step's end).

    With other ranks, the engine compiles it first (`prepare`, which runs nothing) on every
    rank at once (pipe.handshake.agreed): a graph that fails to compile on one rank is
    refused on all before any of them waits on a message."""

    def __init__(self, actions, update=None, unscale=None, counter=None):
        """`actions`: the rank's handlers, built to be traced (pipe.actions.Actions);
        `counter`: a (sum, count) loss's pipe.normalized_loss.TokenCount."""
        super().__init__(auto_prefix=False)
        self.actions, self.update, self.unscale, self.counter = actions, update, unscale, counter
        self.micro_batches = actions.micro_batches
        self.sends = len(actions.messages) > 0

    @ms.jit
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
        """Compile the step for these inputs without running it; its first call with inputs
        of the same shapes then runs what this compiled. (MindSpore has no public call for
        this: `Cell.compile` builds another graph, GRAPH_MODE's, which a `jit` call does not
        use, so every first step compiled twice. This is what a `jit` call does before it
        runs: its executor's `compile`.)"""
        construct = type(self).construct.__wrapped__
        _JitExecutor(construct, 0, obj=self).compile(construct.__name__, *inputs)

    def cut(self, rows):
        """The replica's rows as its micro-batches (one: the rows themselves, no operator)."""
        if self.micro_batches == 1:
            return (rows,)
        return ops.split(rows, rows.shape[0] // self.micro_batches)
