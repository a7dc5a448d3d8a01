"""A loss normalized over the whole batch: `loss_fn` may return (sum, count).

A token mean over padded sequences is a sum over real targets / their number; averaging
micro-batch means would weigh a short micro-batch like a long one. Given (sum, count),
each micro-batch's backward starts from d sum / d logits x 1/(the global batch's count),
so the summed gradients are one process's d(sum / count), fp16's scaling included.

The count is computed from the labels alone, as `loss_fn(zeros, labels)[1]` over the
global batch (`TokenCount`), on the device as the step's first work; a count that changes
with the logits is refused before the first step (pipe.ops.handshake), 0 / 0 after its step."""
import mindspore as ms
from mindspore import nn, ops

__all__ = ["LossTerm", "TokenCount", "loss_sum"]


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
    """(the global batch's labels, the scale S) -> (S / count, count), the count taken on
    zero logits made from an input (S x 0), which the compiler cannot fold into a constant."""

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
    """A rank's micro-batch losses summed (zero off the last stage); at M=1 the loss itself."""
    if not losses:
        return ops.zeros((), ms.float32)
    return losses[0] if len(losses) == 1 else ops.stack(losses).sum()
