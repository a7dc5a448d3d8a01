"""A loss normalized over the whole batch: `loss_fn` may return (sum, count).

A token-mean loss over padded sequences is a sum over the non-padding targets divided by
their number. Averaging each micro-batch's mean would weigh a short micro-batch like a
long one: another model than one process trains. Given (sum, count), the step's gradient
is d(total sum)/d(weights) / total count, over every micro-batch and replica, and the
loss reported is total sum / total count: one process's token mean, exactly. Each
micro-batch's backward starts from d sum / d logits x 1/(M x D) like a scalar loss's (the
count has no gradient); once the counts are summed (one small all-reduce per step), the
gradients are scaled by M x D / total count. A scalar loss keeps its meaning: the mean of
the micro-batch means, which is the batch mean when micro-batches are the same size.
"""
import mindspore as ms
from mindspore import ops

__all__ = ["CountedLoss", "to_token_mean", "refuse_in_graph"]


class CountedLoss:
    """Chunk feature: on the model's last chunk, a (sum, count) loss hands on its sum and
    keeps its count in `counts` (this step's, in micro-batch order)."""

    def zero_grads(self):
        super().zero_grads()
        self.counts = []

    def forward(self, mb, x, labels=None):
        out = super().forward(mb, x, labels)
        if not (self.is_last and isinstance(out, tuple)):
            return out
        self.counts.append(out[1])
        return out[0]


def refuse_in_graph(config, counted):
    """The step as one graph sums its loss inside; a (sum, count) pair is not read there."""
    if counted and config.one_graph:
        raise ValueError("loss_fn returns (sum, count), which one_graph does not normalize: "
                         "turn one_graph off, or return the loss as one mean")


def to_token_mean(wire, chunks, micro_batches):
    """Scale the chunks' summed gradients (each micro-batch's started x 1/`micro_batches`,
    M x D) to d(total sum) / total count; returns the total count."""
    total = _total_count(wire, chunks)
    for chunk in chunks:
        chunk.grads = tuple(g * (micro_batches / total) for g in chunk.grads)
    return total


def _total_count(wire, chunks):
    """The step's count over every rank (the last stages hold them), on every rank."""
    counts = [c.astype(ms.float32) for chunk in chunks for c in chunk.counts]
    mine = ops.stack(counts).sum().reshape(1) if counts else ops.zeros(1, ms.float32)
    return float(wire.all_reduce(mine, tuple(range(wire.size))).asnumpy()[0])
