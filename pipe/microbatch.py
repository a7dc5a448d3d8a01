"""One step's global batch cut into this replica's M micro-batches.

Replica r of D takes rows [r B/D, (r+1) B/D) of the global batch, in M equal pieces; each
piece keeps the rows it came from, which name its samples' dropout masks (pipe.dropout).
Predicting cuts the whole batch on every replica (no data parallelism, no dropout).
"""
from dataclasses import dataclass, field
from functools import cached_property

import mindspore as ms
import numpy as np

from pipe.dropout import MaskDraw

__all__ = ["MicroBatches", "split", "split_for_predict"]


@dataclass
class MicroBatches:
    """One step's micro-batches, and what the last stage produced from them. `source` is
    the batch as given (inputs, labels), `cut` each micro-batch's rows of it; the tensors
    are cut at first use (the step graph takes the replica's rows whole, `rows()`, and
    cuts them inside: no operator per piece)."""
    source: tuple
    cut: list
    training: bool
    draws: list = field(default_factory=list)     # each micro-batch's dropout masks
    outputs: list = field(default_factory=list)   # losses (training) or model outputs

    @cached_property
    def inputs(self):
        return [_tensor(self.source[0][c]) for c in self.cut]

    @cached_property
    def labels(self):
        return [_tensor(self.source[1][c]) for c in self.cut]

    def rows(self):
        """This replica's (inputs, labels), uncut."""
        mine = slice(self.cut[0].start, self.cut[-1].stop)
        return tuple(_tensor(a if mine == slice(0, len(a)) else a[mine]) for a in self.source)


def _tensor(array):
    return array if isinstance(array, ms.Tensor) else ms.Tensor(np.asarray(array))


def split(config, inputs, labels, replica, step):
    """Replica `replica`'s M micro-batches of the global batch for optimizer step `step`."""
    M, D = config.micro_batches, config.data_parallel
    if len(inputs) != config.batch_size or len(labels) != len(inputs):
        raise ValueError(f"train_step got {len(inputs)} inputs and {len(labels)} labels; "
                         f"batch_size={config.batch_size} is configured")
    size = config.batch_size // (D * M)
    cut = [slice((replica * M + m) * size, (replica * M + m + 1) * size) for m in range(M)]
    return MicroBatches((inputs, labels), cut, True,
                        [MaskDraw(config.seed, step, c, config.batch_size) for c in cut])


def split_for_predict(config, inputs):
    """The whole of `inputs` in M micro-batches, labels unused."""
    M = config.micro_batches
    if len(inputs) % M:
        raise ValueError(f"predict got {len(inputs)} inputs, not divisible into micro_batches="
                         f"{M}: pass a multiple of {M}")
    size = len(inputs) // M
    cut = [slice(m * size, (m + 1) * size) for m in range(M)]
    return MicroBatches((inputs, np.zeros(len(inputs), np.int32)), cut, False)
