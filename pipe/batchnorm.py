"""Layers with buffers (batch norm's moving statistics): moved once per forward, averaged
over the replicas.

A layer in training mode updates its buffers each time it runs; pipe's backward runs a
layer again, so the chunk puts the buffers back as they were after every backward piece.
After the step, each buffer is averaged over the replicas, which saw different data.
"""
from contextlib import contextmanager
from functools import cached_property

from mindspore import ops

__all__ = ["BatchNorm", "average_buffers", "refuse_deferred"]


class BatchNorm:
    """Chunk feature: `buffers` kept through every backward piece (B, I, W)."""

    @cached_property
    def buffers(self):
        return list({id(b): b for layer in self.layers for b in layer.untrainable_params()}.values())

    @contextmanager
    def buffers_kept(self):
        """Put the buffers back as they were: the backward runs layers a second time."""
        before = [b.value().copy() for b in self.buffers]
        yield
        for buffer, value in zip(self.buffers, before):
            ops.assign(buffer, value)        # in place: compiled graphs hold its storage

    def backward(self, mb, dy=None):
        with self.buffers_kept():
            return super().backward(mb, dy)

    def backward_input(self, mb, dy=None):
        with self.buffers_kept():
            return super().backward_input(mb, dy)

    def backward_weight(self, mbs):
        with self.buffers_kept():
            super().backward_weight(mbs)


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
