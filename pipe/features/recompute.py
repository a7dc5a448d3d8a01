"""Activation recomputation: a micro-batch in flight keeps only its chunk's input.

The backward runs the forward again to get the layer residuals back: less memory, one
more forward per micro-batch (Chen et al., 2016; Megatron's full recompute). The F handler
(pipe.actions) keeps the forward's input (x, labels, dropout masks) alone; the backward
pieces call `restored`, in the loop and in the graph alike.
"""
__all__ = ["restored"]


def restored(forward, forward_input, scale, is_last):
    """(residuals, the loss gradient to start from or None) again, from the kept input:
    the chunk's forward cell run a second time, on the same masks."""
    x, labels, masks = forward_input
    out, residuals = forward(x, labels, scale, masks)
    return residuals, out[1] if is_last else None
