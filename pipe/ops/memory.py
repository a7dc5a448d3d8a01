"""How many bytes of activations a rank holds in flight, and the most it held at once."""
from pipe.wire import tensors_in

__all__ = ["Memory", "Held"]


class Memory:
    """Bytes held now and at most over a rank's stores of what waits for a backward piece;
    an entry's bytes are read once per batch shapes, store and key (reading a new tensor's
    shape waits for it)."""

    def __init__(self):
        self.held = self.peak = 0
        self.sizes = {}


class Held(dict):
    """A step's store of entries by key (`name`: the store's, and the micro-batches' shapes),
    counting their bytes in `memory`; an entry taken (set to None) gives them back."""

    def __init__(self, memory, name):
        super().__init__()
        self.memory, self.name = memory, name

    def _bytes(self, key, entry):
        if entry is None:
            return 0
        where = (self.name, key)
        if where not in self.memory.sizes:
            self.memory.sizes[where] = sum(t.nbytes for t in tensors_in(entry))
        return self.memory.sizes[where]

    def __setitem__(self, key, entry):
        self.memory.held += self._bytes(key, entry) - self._bytes(key, self.get(key))
        self.memory.peak = max(self.memory.peak, self.memory.held)
        super().__setitem__(key, entry)
