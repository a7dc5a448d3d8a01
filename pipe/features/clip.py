"""Gradient clipping by the whole model's norm, over pipeline stages and replicas.

Each rank holds the gradients of its stages' weights only, so the global L2 norm is a sum
of squares over every rank: each rank adds its own (a weight held on several ranks, a tied
embedding, on one of them: `norm_once`), one all-reduce adds them up, and each replica's
copy of a stage counts once (/ D).
"""
import math

import mindspore as ms
from mindspore import ops

__all__ = ["clip_by_global_norm"]


def clip_by_global_norm(wire, grads, norm_once, clip, world, replicas):
    """Every gradient x clip / max(norm, clip), `norm` the whole model's: each rank adds the
    squares of its gradients marked in `norm_once` (a weight on several ranks: on one),
    summed over the world / D replicas."""
    mine = [(g * g).sum() for g, once in zip(grads, norm_once) if once]
    squares = ops.stack(mine).sum().reshape(1) if mine else ops.zeros(1, ms.float32)
    norm = math.sqrt(float(wire.all_reduce(squares, world).asnumpy()[0]) / replicas)
    return grads if norm <= clip else tuple(g * (clip / norm) for g in grads)

