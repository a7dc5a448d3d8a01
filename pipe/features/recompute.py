"""Activation recomputation: a micro-batch in flight keeps only its chunk's input.

The backward runs the forward again to get the layer residuals back: less memory, one
more forward per micro-batch (Chen et al., 2016; Megatron's full recompute). `Recompute`
is what F keeps and what a backward piece restores (pipe.actions.KeepResiduals otherwise),
in the loop and in the graph alike."""
from mindspore import nn

__all__ = ["Recompute"]


class Recompute(nn.Cell):
    def kept(self, x, labels, masks, out, residuals, is_last):
        """F keeps its input (x, labels, dropout masks) alone."""
        return x, labels, masks

    def restored(self, forward, kept, scale, is_last):
        """(residuals, the loss gradient to start from or None) again, from the kept input:
        the chunk's forward cell run a second time, on the same masks."""
        x, labels, masks = kept
        out, residuals = forward(x, labels, scale, masks)
        return residuals, out[1] if is_last else None
