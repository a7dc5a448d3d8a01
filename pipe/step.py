"""One rank's share of a training step, written once: run as Python (the loop) or compiled.

    loss, grads, done, count = step.run(rows, labels, extras, scale, counted)

`Step.construct` counts a (sum, count) loss's targets, cuts the rows into micro-batches and
runs the rank's actions (pipe.actions) in the schedule's order. The loop calls it as plain
Python, each handler one compiled call; one graph compiles this same function once per batch
shape, each message an in-graph operator, every action ordered after the one before by a
token (the list's order cannot deadlock, so the graph cannot). What follows the actions
(the sum over replicas, unscale, tied copies, clip, update) is
`PipelineEngine.update_weights`, after either."""
from mindspore import nn, ops

from pipe.compiled import executor
from pipe.features.token_loss import loss_sum

__all__ = ["Step"]


class Step(nn.Cell):
    """(this replica's rows, their labels, each micro-batch and chunk's extras for the forward
    (dropout's masks), the loss gradient's scale, the global batch's labels for a (sum,
    count) loss or ()) -> (this rank's losses summed, its weight gradients summed over the
    micro-batches, one flat tuple; a token set once every action is done; the global
    batch's count or ())."""

    def __init__(self, actions, counter, one_graph):
        super().__init__(auto_prefix=False)
        self.actions, self.counter = actions, counter
        self.micro_batches = actions.micro_batches
        self.one_graph = one_graph
        self.sends = len(actions.messages) > 0
        self.graph = executor(self) if one_graph else None       # (called as pipe.compiled says)

    def run(self, *inputs):
        return self.graph(*inputs) if self.one_graph else self.construct(*inputs)

    def construct(self, rows, labels, extras, scale, counted):
        count = ()
        if self.counter is not None:   # the global batch's count divides the scale first
            scale, count = self.counter(counted, scale)
        data = (self.cut(rows), self.cut(labels), extras, scale)
        state = self.actions.run_all(self.actions.start(), data)
        return loss_sum(state["outputs"]), self.actions.summed(state), state["done"], count

    def prepare(self, *inputs):
        """Compile the graph (one_graph) for these inputs without running it, as a call would."""
        self.graph.compile("run", *inputs)

    def cut(self, rows):
        """The replica's rows as its micro-batches (one: the rows themselves, no operator)."""
        if self.micro_batches == 1:
            return (rows,)
        return ops.split(rows, rows.shape[0] // self.micro_batches)
