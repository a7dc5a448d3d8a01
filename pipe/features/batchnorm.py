"""Layers with buffers (batch norm's moving statistics): moved once per forward, averaged
over the replicas.

A layer in training mode updates its buffers each time it runs; pipe's backward runs a
layer again, so each backward piece (B, I, W) saves the buffers before it and puts them
back after (`pipe.layers.Buffers`). After the step, each buffer is averaged over the replicas, which saw different
data.
"""
from contextlib import contextmanager

from mindspore import ops

__all__ = ["buffers_kept", "average_buffers", "refuse_deferred"]


@contextmanager
def buffers_kept(chunk):
    """Run the body, then put the chunk's buffers back as they were (the check before the
    first step runs forwards that must move nothing)."""
    copies = chunk.kept_buffers.save()
    yield
    chunk.kept_buffers.put_back(copies, copies)


def average_buffers(wire, buffers, replica_ranks):
    """Each buffer set to its mean over the replicas. (One all-reduce per buffer: a slice of
    a flat buffer would be a view, which batch norm's in-place update refuses; assigned in
    place, since compiled graphs hold its storage.)"""
    for buffer in buffers:
        ops.assign(buffer, wire.all_reduce(buffer.value(), replica_ranks) / len(replica_ranks))


def refuse_deferred(config, buffers):
    """Weight gradients deferred to the flush would normalize by the wrong statistics."""
    if config.defer_wgrad and buffers:
        raise ValueError("defer_wgrad runs each layer's weight gradient once over the rows "
                         "of all micro-batches: batch norm (a layer with buffers) would normalize "
                         "them by the statistics of all those rows, not of each micro-batch; "
                         "turn defer_wgrad off")
