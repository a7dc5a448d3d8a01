"""A tiny language model whose output head reuses the input embedding (tied weights).

    tokens -> Embedding(V, d) -> L x (Dense d + Tanh) -> logits = h @ E^T

In a pipeline the embedding sits on the first stage and the head on the last: both hold a
copy of E, and pipe keeps the copies equal by summing their gradients before each step
(`pipe.features.tied.tied_weights` finds them; the engine all-reduces their gradients). The
task: predict (3 * token + 1) mod V.
"""
import numpy as np
from mindspore import nn, ops


class TiedHead(nn.Cell):
    """Logits from the embedding table itself."""

    def __init__(self, embedding):
        super().__init__()
        self.table = embedding.embedding_table

    def construct(self, h):
        return ops.matmul(h, self.table.T)


def build_tied_model(vocab=32, dim=16, layers=2):
    embedding = nn.Embedding(vocab, dim)
    blocks = [nn.SequentialCell([nn.Dense(dim, dim), nn.Tanh()]) for _ in range(layers)]
    return nn.SequentialCell([embedding, *blocks, TiedHead(embedding)])


def batch(vocab, size, step):
    tokens = np.random.default_rng(step).integers(0, vocab, size).astype(np.int32)
    return tokens, ((3 * tokens + 1) % vocab).astype(np.int32)
