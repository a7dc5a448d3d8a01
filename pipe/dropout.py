"""Dropout masks drawn on the host from (seed, step, layer, sample): every layout draws the same.

MindSpore's dropout draws its mask inside the compiled graph, from the kernel's own
generator: how a sample is dropped then depends on how the batch was cut into micro-batches
and in which order they ran, and on CPU it is not even repeatable from run to run. Here a
dropout layer's mask for a whole step is a function of the seed, the step number, the
layer's place in the whole model and the sample's row in the global batch; a micro-batch
takes its rows of it. One process, 4 stages x 2 replicas and any number of micro-batches
drop the same units of the same samples, and a seeded run repeats exactly.
"""
from dataclasses import dataclass

import mindspore as ms
import numpy as np

__all__ = ["MaskDraw"]


@dataclass(frozen=True)
class MaskDraw:
    """Where one micro-batch's dropout masks come from."""
    seed: int
    step: int            # the optimizer step, 1 for the first
    rows: slice          # this micro-batch's rows of the global batch
    batch_size: int      # rows of the global batch

    def keep(self, layer, shape, keep_prob):
        """1.0 for each unit of `shape` (this micro-batch's input to the dropout layer
        `layer`, a tuple of ints naming it in the whole model) that is kept, 0.0 if dropped."""
        rng = np.random.default_rng((self.seed, self.step, *layer))
        uniform = rng.random((self.batch_size, *shape[1:]), dtype=np.float32)
        return ms.Tensor((uniform[self.rows] < keep_prob).astype(np.float32))
