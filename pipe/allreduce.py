"""What the ranks add up besides core's sum over replicas: tied weights and the global norm.

A weight used on two stages (a tied embedding and output head) has a copy on each; their
gradients are summed over every rank that holds one. Clipping by the global norm adds the
squared gradients of the whole model over every rank.
"""
import math

import mindspore as ms
from mindspore import ops

from pipe.core.engine import sum_over

__all__ = ["sum_gradients", "clip_by_global_norm"]


def sum_gradients(wire, grads, replica_ranks, tied):
    """`grads` summed over `replica_ranks` as one flat buffer; `tied[k]`: the ranks that
    hold a copy of weight k (its replicas included), summed over those instead."""
    grads = list(grads)
    plain = [k for k in range(len(grads)) if k not in tied]
    for k, summed in zip(plain, sum_over(wire, [grads[k] for k in plain], replica_ranks)):
        grads[k] = summed
    for k, ranks in tied.items():
        grads[k] = wire.all_reduce(grads[k], ranks)
    return tuple(grads)


def clip_by_global_norm(wire, grads, counted, clip, world, replicas):
    """Every gradient scaled by clip / max(norm, clip), `norm` the L2 norm of the whole
    model's gradient (as ops.clip_by_global_norm on one process). Each rank adds the squares
    of the gradients it `counted` (a tied weight's on one of its ranks only); the world sums
    them, and the replicas, holding the same gradients, count `replicas` times."""
    mine = [(g * g).sum() for g, count in zip(grads, counted) if count]
    squares = ops.stack(mine).sum().reshape(1) if mine else ops.zeros(1, ms.float32)
    norm = math.sqrt(float(wire.all_reduce(squares, world).asnumpy()[0]) / replicas)
    return grads if norm <= clip else tuple(g * (clip / norm) for g in grads)
