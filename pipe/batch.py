"""Micro-batches: the global batch's rows, cut for one replica into M pieces."""
import zlib
from dataclasses import dataclass
from functools import cached_property

import mindspore as ms
import numpy as np

__all__ = ["MicroBatches", "split", "as_tensor", "replica_rows"]

ARRAYS = (np.ndarray, ms.Tensor)


@dataclass
class MicroBatches:
    """A step's micro-batches: `cut`, each one's rows of `source` (inputs, labels)."""
    source: tuple
    cut: list

    def __post_init__(self):
        for name, array in zip(("inputs", "labels"), self.source):   # (predict's labels: None)
            if array is not None and not isinstance(array, ARRAYS):
                raise TypeError(f"the batch's {name} must be a numpy array or a MindSpore "
                                f"Tensor, not a {type(array).__name__}: pass {fix(name, array)}")

    @cached_property
    def inputs(self):
        return [as_tensor(self.source[0][c]) for c in self.cut]

    @cached_property
    def labels(self):
        return [as_tensor(self.source[1][c]) for c in self.cut]

    def words(self):
        """The global batch as its caller passed it, in words (for errors)."""
        (x, y), rows = self.source, self.cut[0].stop - self.cut[0].start
        labels = "" if y is None else f", labels of shape {np.shape(y)} {y.dtype}"
        return f"inputs of shape {np.shape(x)} {x.dtype}{labels}, in micro-batches of {rows} rows"

    def fingerprint(self):
        """A CRC-32 (as an int32) of the whole batch as its caller passed it: every rank's."""
        arrays = [a.asnumpy() if isinstance(a, ms.Tensor) else a for a in self.source]
        return zlib.crc32(b"".join(np.asarray(a).tobytes() for a in arrays if a is not None)) >> 1

    @cached_property
    def shapes(self):   # (inputs, labels) of one, read off `source`: cutting costs 2M operators
        return tuple((self.cut[0].stop - self.cut[0].start, *np.shape(a)[1:]) for a in self.source)


def fix(name, value):
    """One array for `value`: several side by side are stacked (pipe cuts one array's rows)."""
    if isinstance(value, (tuple, list)) and all(isinstance(a, ARRAYS) for a in value):
        used = "the first layer" if name == "inputs" else "loss_fn"
        return f"np.stack({name}, axis=1), and take them apart in {used}"
    return f"np.asarray({name})"


def as_tensor(array):
    return array if isinstance(array, ms.Tensor) else ms.Tensor(np.asarray(array))


def split(config, inputs, labels, replica):
    """Replica r's M micro-batches: rows [r B/D, (r+1) B/D) of the global batch, in M pieces."""
    M, D, n = config.micro_batches, config.data_parallel, config.batch_size
    size, first = n // (D * M), replica * M
    batch = MicroBatches((inputs, labels), [slice((first + m) * size, (first + m + 1) * size)
                                            for m in range(M)])     # (checks they are arrays)
    if len(inputs) != n or len(labels) != n:
        raise ValueError(f"train_step got {len(inputs)} inputs and {len(labels)} labels; "
                         f"batch_size={n} is configured")
    return batch


def replica_rows(batch):
    """This replica's (inputs, labels), uncut: the step cuts them (pipe.step)."""
    mine = slice(batch.cut[0].start, batch.cut[-1].stop)     # (np.shape: a Tensor's len is
    return tuple(as_tensor(a if mine == slice(0, np.shape(a)[0]) else a[mine])   # an operator)
                 for a in batch.source)
