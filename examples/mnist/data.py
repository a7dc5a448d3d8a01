"""MNIST for the example: the real digits from IDX files, or a synthetic stand-in."""
import gzip
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
            ndim = raw[3]
            dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
            return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)
    raise FileNotFoundError(f"{name}[.gz] not found in {directory!r}: put the four MNIST IDX "
                            "files there, or use --data synthetic")


def _from_idx(directory):
    out = []
    for split in ("train", "test"):
        images, labels = (_read_idx(directory, n) for n in FILES[split])
        out += [images.reshape(len(images), -1).astype(np.float32) / 255.0, labels.astype(np.int32)]
    return tuple(out)


def _synthetic(seed, train=8192, test=1024):
    """Ten random 28x28 'digit' prototypes plus noise: learnable, deterministic, offline."""
    rng = np.random.default_rng(seed)
    prototypes = rng.random((10, 784), dtype=np.float32)
    def draw(n):
        labels = rng.integers(0, 10, n).astype(np.int32)
        images = prototypes[labels] + 0.5 * rng.standard_normal((n, 784)).astype(np.float32)
        return np.clip(images, 0, 1).astype(np.float32), labels
    return (*draw(train), *draw(test))


def load(kind, directory, seed):
    """(train_images, train_labels, test_images, test_labels): images as (N, 784) float32."""
    if kind == "synthetic":
        return _synthetic(seed)
    if kind == "mnist":
        return _from_idx(directory)
    raise ValueError(f"unknown data set {kind!r}: use 'synthetic' or 'mnist'")


def batches(images, labels, batch_size, seed):
    """Endless (images, labels) mini-batches, reshuffled each epoch; the same on every rank."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(images))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[start:start + batch_size]
            yield images[idx], labels[idx]
