"""Activation recomputation: a micro-batch in flight keeps only its chunk's input.

The backward runs the forward again to get the layer residuals back: less memory, one
more forward per micro-batch (Chen et al., 2016; Megatron's full recompute). Both halves
are called by the F and backward handlers (pipe.actions), in the loop and in the graph.
"""
__all__ = ["kept", "restored"]


def kept(forward_input):
    """What waits for the backward: the forward's input (x, labels, dropout masks) alone."""
    return forward_input


def restored(forward, forward_input, scale, is_last):
    """(residuals, the loss gradient to start from or None) again, from the kept input:
    the chunk's forward cell run a second time, on the same masks."""
    x, labels, masks = forward_input
    out, residuals = forward(x, labels, scale, masks)
    return residuals, out[1] if is_last else None
