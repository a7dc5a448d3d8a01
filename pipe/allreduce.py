"""After the schedule: what the ranks add up before and after the optimizer step.

Gradients are summed over the D replicas of a stage (one flat message), a tied weight's
over every rank that holds a copy; the squared gradient norm for clipping over every rank;
batch norm's moving statistics are averaged over the replicas; the step's loss, known to
the last stages, reaches every rank. Each is one call of the wire's `all_reduce`.
"""
import math

import mindspore as ms
from mindspore import ops

__all__ = ["sum_gradients", "clip_by_global_norm", "average_buffers", "loss_share", "step_loss"]


def sum_gradients(wire, grads, replica_ranks, tied):
    """`grads` summed over `replica_ranks` as one flat buffer; `tied[k]`: the ranks that
    hold a copy of weight k (its replicas included), summed over those instead."""
    grads = list(grads)
    plain = [k for k in range(len(grads)) if k not in tied]
    if len(replica_ranks) > 1 and plain:
        flat = wire.all_reduce(ops.cat([grads[k].reshape(-1) for k in plain]), replica_ranks)
        for k, part in zip(plain, ops.split(flat, [grads[k].size for k in plain])):
            grads[k] = part.reshape(grads[k].shape)
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


def average_buffers(wire, buffers, replica_ranks):
    """Each buffer set to its mean over the replicas, which saw different data. (One
    all-reduce per buffer: a slice of a flat buffer would be a view, which batch norm's
    in-place update refuses; assigned in place, since compiled graphs hold its storage.)"""
    for buffer in buffers:
        ops.assign(buffer, wire.all_reduce(buffer.value(), replica_ranks) / len(replica_ranks))


def loss_share(losses, micro_batches):
    """This rank's share of the step's mean loss, on the device: its micro-batches' losses
    (the last stages hold them) / M, as a 1-element tensor (0 on other stages). Also
    called inside the step graph (pipe.step_graph)."""
    if not losses:
        return ops.zeros(1, ms.float32)
    return (ops.stack(losses).sum() / micro_batches).reshape(1)


def step_loss(wire, share, replicas, world):
    """The step's mean loss on every rank: the shares summed over the world and the
    replicas averaged, so the host waits for it once."""
    return float(wire.all_reduce(share, world).asnumpy()[0]) / replicas
