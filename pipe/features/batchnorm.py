"""Layers with buffers (batch norm's moving statistics): moved once per forward, averaged
over the replicas after the step (pipe's backward runs a layer again: each backward piece
puts the buffers back, `pipe.layers.Buffers`)."""
from contextlib import contextmanager

from mindspore import ops

__all__ = ["buffers_kept", "average_buffers", "refuse_deferred"]


@contextmanager
def buffers_kept(chunk):
    """Run the body, then put the chunk's buffers back as they were."""
    copies = chunk.kept_buffers.save()
    yield
    chunk.kept_buffers.put_back(copies, copies)


def average_buffers(wire, buffers, replica_ranks):
    """Each buffer set in place to its mean over the replicas, one all-reduce each (batch
    norm's in-place update refuses a view of a flat buffer)."""
    for buffer in buffers:
        ops.assign(buffer, wire.all_reduce(buffer.value(), replica_ranks) / len(replica_ranks))


def refuse_deferred(config, buffers):
    """Weight gradients deferred to the flush would normalize by the wrong statistics."""
    if config.defer_wgrad and buffers:
        raise ValueError("defer_wgrad runs each layer's weight gradient once over the rows of "
                         "all micro-batches, which batch norm would normalize by the statistics "
                         f"of them all, not of each micro-batch; '{buffers[0].name}' is a "
                         "parameter not trained, which pipe treats as batch norm's statistics "
                         "(it cannot tell a frozen weight from them); turn defer_wgrad off")
