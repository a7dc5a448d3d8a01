"""Activation recomputation: a micro-batch in flight keeps only its chunk's input.

The backward runs the forward again to get the layer residuals back: less memory, one
more forward per micro-batch (Chen et al., 2016; Megatron's full recompute).
"""
from pipe.core.chunk import variable

__all__ = ["Recompute"]


class Recompute:
    """Chunk feature, through core's `kept` / `restored` seams."""

    def kept(self, x, labels, extras, residuals, out):
        return x, labels, extras

    def restored(self, kept):
        x, labels, extras = kept
        out, residuals = self.forward_cell(variable(x), self.labels(labels), self.grad_scale, extras)
        return residuals, out[1] if self.is_last else None
