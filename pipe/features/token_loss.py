"""A loss normalized over the whole batch: `loss_fn` may return (sum, count).

A token-mean loss over padded sequences is a sum over the non-padding targets divided by
their number. Averaging each micro-batch's mean would weigh a short micro-batch like a
long one: another model than one process trains. Given (sum, count), every micro-batch's
backward starts from d sum / d logits x 1/(total count), the count of the whole global
batch, so the gradients summed over micro-batches and replicas are one process's
d(sum / count), and in fp16 they are scaled by S exactly as one process's (sum / count) x S
would be: the same overflows, the same skipped steps. The loss reported is total sum /
total count.

So the count must be known before the step's first backward: pipe computes it from the
labels alone, on every rank, as `loss_fn(zeros, labels)[1]` over the whole global batch
(`TokenCount`), on the device as the step's first work: inside the step's graph, or in
the loop as a call of its own. The host reads it after the step, with the loss, so the
device never waits for the host. `loss_fn`'s count must therefore depend on the labels
only, as a count of non-padding targets does; a count that changes with the logits is
refused before the first step (`check_count`). A batch with nothing to count, 0 / 0, is
refused right after its step (`PipelineEngine.loss_weight` says what that step did).
A scalar loss keeps its meaning: the mean of the micro-batch means, each weighed 1/(M x D),
which is the batch mean when micro-batches are the same size.
"""
import mindspore as ms
import numpy as np
from mindspore import nn, ops

__all__ = ["LossTerm", "TokenCount", "is_counted", "check_count", "loss_sum"]


class LossTerm(nn.Cell):
    """(logits, labels) -> what a micro-batch's backward differentiates: `loss_fn`'s scalar,
    or the sum of its (sum, count)."""

    def __init__(self, loss_fn):
        super().__init__(auto_prefix=False)
        self.loss_fn = loss_fn

    def construct(self, logits, labels):
        loss = self.loss_fn(logits, labels)
        return loss[0] if isinstance(loss, tuple) else loss


class TokenCount(nn.Cell):
    """(the global batch's labels, the scale S) -> (S / count, count): `loss_fn`'s count for
    those labels, on logits that are all zero, and the loss gradient's scale it gives.

    The zeros are S x 0: made from an input, they stay an operator (zeros of a constant
    shape would be folded into a constant the logits' size when compiled), and the compiler
    drops the sum nobody reads."""

    def __init__(self, loss_fn, logits_spec):
        super().__init__(auto_prefix=False)
        self.loss_fn = loss_fn
        self.per_row, self.dtype = tuple(logits_spec[0][1:]), logits_spec[1]   # after the rows

    def construct(self, labels, scale):
        zero = (scale * 0).astype(self.dtype)
        logits = ops.broadcast_to(zero, (labels.shape[0],) + self.per_row)
        count = self.loss_fn(logits, labels)[1].astype(ms.float32)
        return scale / count, count


def loss_sum(losses):
    """A rank's micro-batch losses summed, a scalar (zero off the last stage), in the loop
    and in the step's graph: at M=1 the loss itself, as one process's step gives it."""
    if not losses:
        return ops.zeros((), ms.float32)
    return losses[0] if len(losses) == 1 else ops.stack(losses).sum()


def is_counted(loss_fn, logits_spec, labels):
    """Whether `loss_fn` returns (sum, count), asked on zero logits of `logits_spec`."""
    return isinstance(loss_fn(ops.zeros(*logits_spec), labels), tuple)


def check_count(loss_fn, logits_spec, labels):
    """Refuse a count that changes with the logits: pipe counts before the backward."""
    shape, dtype = logits_spec
    other = ms.Tensor(np.random.default_rng(0).standard_normal(shape), dtype)
    counts = [float(loss_fn(logits, labels)[1].asnumpy())
              for logits in (ops.zeros(shape, dtype), other)]
    if counts[0] != counts[1]:
        raise ValueError(f"loss_fn returns (sum, count), and its count changes with the logits "
                         f"({counts[0]:g} for zero logits, {counts[1]:g} for others): pipe needs "
                         "the step's total count before its first backward, so it counts on the "
                         "labels alone; make the count depend on the labels only (as a count of "
                         "non-padding targets does)")
