"""How many bytes of activations a chunk holds in flight, and the most it held at once."""
import mindspore as ms

__all__ = ["Held"]


def _tensors(entry):
    if isinstance(entry, (tuple, list)):
        return [t for part in entry for t in _tensors(part)]
    return [entry] if isinstance(entry, ms.Tensor) else []


class Held(dict):
    """A chunk's store of micro-batches in flight (`residuals`, `waiting`), adding their bytes
    to `counter` ({"held", "peak"}, shared by a chunk's stores). Bytes are read once per
    layout of shapes: reading a tensor's size can wait for the device."""

    sizes = {}                           # (shape, dtype) of each tensor -> bytes

    def __init__(self, counter):
        super().__init__()
        self.counter = counter

    def _bytes(self, entry):
        tensors = _tensors(entry)
        key = tuple((t.shape, t.dtype) for t in tensors)
        if key not in self.sizes:
            self.sizes[key] = sum(t.nbytes for t in tensors)
        return self.sizes[key]

    def __setitem__(self, mb, entry):
        super().__setitem__(mb, entry)
        self.counter["held"] += self._bytes(entry)
        self.counter["peak"] = max(self.counter["peak"], self.counter["held"])

    def pop(self, mb):
        entry = super().pop(mb)
        self.counter["held"] -= self._bytes(entry)
        return entry
