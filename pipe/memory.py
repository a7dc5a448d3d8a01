"""How many bytes of activations a chunk holds in flight, and the most it held at once."""
import mindspore as ms

__all__ = ["Held"]


def _tensors(entry):
    if isinstance(entry, (tuple, list)):
        return [t for part in entry for t in _tensors(part)]
    return [entry] if isinstance(entry, ms.Tensor) else []


class Held(dict):
    """A chunk's store of micro-batches in flight (`residuals`, `waiting`), adding their bytes
    to `counter` ({"held", "peak"}, shared by a chunk's stores).

    Reading a just-made tensor's shape waits for the operator that makes it: on every action
    that cost the host 0.7-2.7 ms per step of the small MLP on one H200. An entry's shapes follow
    from the step's micro-batch shapes (`batch_shapes()`, which the engine sets each step),
    so its bytes are read once per those shapes and micro-batch (None: read every time)."""

    def __init__(self, counter, batch_shapes):
        super().__init__()
        self.counter, self.batch_shapes, self.sizes = counter, batch_shapes, {}

    def _bytes(self, mb, entry):
        key = (self.batch_shapes(), mb)
        if key[0] is None or key not in self.sizes:
            self.sizes[key] = sum(t.nbytes for t in _tensors(entry))
        return self.sizes[key]

    def __setitem__(self, mb, entry):
        super().__setitem__(mb, entry)
        self.counter["held"] += self._bytes(mb, entry)
        self.counter["peak"] = max(self.counter["peak"], self.counter["held"])

    def pop(self, mb):
        entry = super().pop(mb)
        self.counter["held"] -= self._bytes(mb, entry)
        return entry
