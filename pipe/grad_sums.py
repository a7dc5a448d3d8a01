"""A chunk's weight gradients summed over the step's micro-batches: the small ones at the end.

Each backward piece of a micro-batch gives one gradient per weight, which the step adds to
the chunk's sums: one kernel per weight and micro-batch. On a GPU MindSpore's host takes
~12 us to launch a kernel whatever its size, while the device adds a bias of 768 floats in
well under one. The GPT template has 148 weights, 112 of them small: at M=4 its step
launched ~450 adds (benchmarks/log.md section 34). So the gradients of weights of at most
SMALL elements are kept, micro-batch by micro-batch, and each such weight's are summed
once, when the last is in (one AddN: M - 1 launches fewer for each); a large weight's are
added as they come, which holds one gradient of its size, not M. The sums are the same
floats in either way: each added in micro-batch order.

Written once for the loop and the step's graph (pipe.actions): plain Python over constant
tuples, which the compiler unrolls; run one by one, the adds and the sums are compiled calls.
"""
import mindspore as ms
from mindspore import ops

from pipe.core.chunk import add_grads, pick, variable

__all__ = ["SMALL", "kept_apart", "with_sums", "weight_by_weight"]

SMALL = 2 ** 20     # elements: adding them takes the device about what a launch takes the host


def kept_apart(params):
    """Where each of `params`' gradients goes, as constants: (the positions of the small
    weights, kept per micro-batch; of the others, added as they come; and for each weight its
    sum's place: k >= 0 the k-th other, else small weight -1 - k)."""
    small = tuple(i for i, p in enumerate(params) if p.size <= SMALL)
    large = tuple(i for i in range(len(params)) if i not in small)
    places = tuple(large.index(i) if i in large else -1 - small.index(i) for i in range(len(params)))
    return small, large, places


def with_sums(sums, grads, first_sum, plan):
    """The sums after a backward piece gave `grads`: (the large weights' sums, each small
    weight's gradients so far); `first_sum`: these start them; `plan`: from `kept_apart`."""
    small, large = plan[0], plan[1]
    if first_sum:
        return pick(grads, large), _appended((), pick(grads, small))
    added = add_grads(variable(sums[0]), variable(pick(grads, large))) if large else ()
    return added, _appended(sums[1], pick(grads, small))


def weight_by_weight(sums, plan):
    """The step's sums as one gradient per weight, in the chunk's order."""
    kept = sums[1]
    totals = _totals(variable(kept)) if kept and len(kept[0]) > 1 else _firsts(kept)
    summed = ()
    for k in plan[2]:
        summed = summed + ((sums[0][k] if k >= 0 else totals[-1 - k]),)
    return summed


@ms.jit
def _totals(kept):
    """Each small weight's gradients summed (one AddN each)."""
    totals = ()
    for grads in kept:
        totals = totals + (ops.addn(grads),)
    return totals


def _firsts(kept):
    """Each small weight's one gradient (a step of one micro-batch: nothing to add)."""
    firsts = ()
    for grads in kept:
        firsts = firsts + (grads[0],)
    return firsts


def _appended(kept, grads):
    """Each small weight's gradients so far, with this micro-batch's (`kept` empty: the first)."""
    out = ()
    for k in range(len(grads)):
        out = out + (((kept[k] if kept else ()) + (grads[k],)),)
    return out
