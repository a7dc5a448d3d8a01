"""Gradient clipping by the whole model's norm, over pipeline stages and replicas: each rank
adds its squares (a weight on several ranks counted once: `norm_once`), one all-reduce sums
them, each replica's copy of a stage counting 1/D."""
import math

import mindspore as ms
from mindspore import ops

__all__ = ["clip_by_global_norm"]


def clip_by_global_norm(wire, grads, norm_once, clip, world, replicas):
    """Every gradient x clip / max(norm, clip), `norm` the whole model's."""
    mine = [(g * g).sum() for g, once in zip(grads, norm_once) if once]
    squares = ops.stack(mine).sum().reshape(1) if mine else ops.zeros(1, ms.float32)
    norm = math.sqrt(float(wire.all_reduce(squares, world).asnumpy()[0]) / replicas)
    return grads if norm <= clip else tuple(g * (clip / norm) for g in grads)

