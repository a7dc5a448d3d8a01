"""A small GPT over bytes, as layer builders for pipe, and its text.

    ids (B, T) -> Embed -> (hidden, keep) -> L x block -> (hidden, keep) -> head -> logits

Between layers travels a tuple: the hidden states and `keep`, an int32 mask that is 1 for
a real byte and 0 for padding (sequences are padded to their bucket's length). Each layer
takes the tuple as its arguments (`construct(self, x, keep)`); attention skips padded keys.
The head's output matrix is the input embedding's table (`Tied(0, head)`), kept equal on
the two stages that hold a copy. The loss is (summed cross-entropy over real targets,
their number): pipe divides the whole batch's sum by its count, one process's token mean.

The text is Python's own documentation (`pydoc_data.topics`, shipped with every CPython),
cut into paragraphs of at most `context` bytes and bucketed by length.
"""
import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn, ops
from mindspore.common.initializer import HeUniform, Uniform, initializer

from pipe.features.builders import Tied

PAD, IGNORE, VOCAB = 0, -1, 256     # byte 0 never occurs in the text: it pads
BUCKETS = (32, 64)                  # sequence lengths a batch is padded to


class Embed(nn.Cell):
    """ids -> (token + position embeddings, keep)."""

    def __init__(self, width, context):
        super().__init__()
        self.token = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(context, width)

    def construct(self, ids):
        keep = (ids != PAD).astype(ms.int32)
        return self.token(ids) + self.position(ops.arange(ids.shape[1])), keep


class Norm(nn.Cell):
    """(x, keep) -> (x, the layer norm of x, keep): the residual stream x goes on beside
    the branch that starts here."""

    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm((width,))

    def construct(self, x, keep):
        return x, self.norm(x), keep


MATMUL_NT = ops.MatMul(transpose_b=True)      # a x b^T


def product(h, weight):
    """h (..., in) times weight (out, in) transposed, as one 2-D product over all rows, as
    nn.Dense runs it (`ops.matmul` of a 3-D h would broadcast the weight into a batched
    product, with a transpose each way). A Parameter read directly is cast to the compute
    dtype by hand (float16 layers: `Cell.to_float` casts only inputs)."""
    rows = h.reshape(-1, h.shape[-1])
    out = MATMUL_NT(rows, weight.astype(h.dtype))
    return out.reshape(h.shape[:-1] + (weight.shape[0],))


MATMUL = ops.MatMul()


class AddBias(nn.Cell):
    """(out, bias) -> out + bias on every row. The bias is broadcast to the product's shape
    before the add (MindSpore's GPU add with a broadcast operand runs at a fraction of the
    memory's speed), and its gradient sums the rows as a product with a row of ones
    (MindSpore's ReduceSum over the rows is about ten times slower)."""

    def construct(self, out, bias):
        return out + ops.broadcast_to(bias, out.shape)

    def bprop(self, out, bias, result, dout):
        rows = dout.reshape(-1, dout.shape[-1])
        ones = ops.ones((1, rows.shape[0]), rows.dtype)
        return dout, MATMUL(ones, rows).reshape(bias.shape)


class Linear(nn.Cell):
    """h -> h W^T + b, nn.Dense's product and its initial weights, with the bias added by
    AddBias, not nn.Dense's BiasAdd, whose gradient MindSpore runs on GPUs with cuDNN's
    slow reduction."""

    def __init__(self, width_in, width_out):
        super().__init__()
        self.weight = Parameter(initializer(HeUniform(math.sqrt(5)), [width_out, width_in]),
                                name="weight")
        self.bias = Parameter(initializer(Uniform(1 / math.sqrt(width_in)), [width_out]),
                              name="bias")
        self.add_bias = AddBias()

    def construct(self, h):
        return self.add_bias(product(h, self.weight), self.bias.astype(h.dtype))


class Product(nn.Cell):
    """(x, h, keep) -> (x, dense(h), keep): one product on the branch."""

    def __init__(self, width_in, width_out):
        super().__init__()
        self.dense = Linear(width_in, width_out)

    def construct(self, x, h, keep):
        return x, self.dense(h), keep


class Softmax(nn.Cell):
    """Softmax over the last axis, its gradient (dy - sum(dy * y)) * y with the rows' sums
    broadcast to the scores' shape before the subtraction (MindSpore's own gradient
    subtracts them with its slow broadcasting kernel). MindSpore's own formula: on CPU the
    same numbers to the last bit."""

    def construct(self, x):
        return ops.softmax(x, -1)

    def bprop(self, x, out, dout):
        sums = (dout * out).sum(-1, keepdims=True)
        return ((dout - ops.broadcast_to(sums, out.shape)) * out,)


BATCHED = ops.BatchMatMul()                          # a b, over the leading axes
BATCHED_NT = ops.BatchMatMul(transpose_b=True)       # a b^T
BATCHED_TN = ops.BatchMatMul(transpose_a=True)       # a^T b


class Scores(nn.Cell):
    """(q, k) -> q k^T over the leading (batch, head) axes, with a gradient that hands its
    transposes to the products' flags as the forward does. MindSpore's own gradient of a
    batched product transposes its operands in kernels of their own: with these two cells
    the GPT's layer runs 4 transposes instead of 14."""

    def construct(self, q, k):
        return BATCHED_NT(q, k)

    def bprop(self, q, k, out, dout):
        return BATCHED(dout, k), BATCHED_TN(dout, q)


class Mix(nn.Cell):
    """(p, v) -> p v over the leading axes; its gradient with the products' flags too."""

    def construct(self, p, v):
        return BATCHED(p, v)

    def bprop(self, p, v, out, dout):
        return BATCHED_NT(dout, v), BATCHED_TN(p, dout)


class Attend(nn.Cell):
    """(x, qkv, keep) -> (x, causal self-attention over the kept keys, keep); no weights.
    The queries are scaled by 1/sqrt(head width) before their product with the keys, not
    the scores after it: T/(head width) times fewer elements. The heads are cut from the
    product with one transpose for q, k and v together. The causal mask is broadcast to
    the scores' shape first: MindSpore's GPU select with a broadcast operand is slow."""

    def __init__(self, heads):
        super().__init__()
        self.heads = heads
        self.softmax, self.scores, self.mix = Softmax(), Scores(), Mix()

    def construct(self, x, qkv, keep):
        b, t, d = x.shape
        h = self.heads
        heads = qkv.reshape(b, t, 3, h, d // h).transpose(2, 0, 3, 1, 4)   # (3, b, h, t, d/h)
        q, k, v = [z.reshape(b, h, t, d // h) for z in ops.split(heads, 1, axis=0)]
        q = q / math.sqrt(d // h)
        allowed = ops.tril(ops.ones((t, t), ms.int32)) * keep.reshape(b, 1, 1, t) > 0
        allowed = ops.broadcast_to(allowed, (b, h, t, t))
        scores = self.scores(q, k)
        scores = ops.where(allowed, scores, ops.full_like(scores, -1e4))   # (float16's range)
        y = self.mix(self.softmax(scores), v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return x, y, keep


class Gelu(nn.Cell):
    """(x, h, keep) -> (x, gelu(h), keep), GPT-2's tanh approximation: one GeLU kernel each
    way, where the exact form (erf) is six operators on GPUs."""

    def construct(self, x, h, keep):
        return x, ops.gelu(h, approximate="tanh"), keep


class Residual(Product):
    """(x, h, keep) -> (x + dense(h), keep): the branch's last product, added to the stream."""

    def construct(self, x, h, keep):
        return x + self.dense(h), keep


def block(width, heads):
    """(x, keep) -> (x, keep): pre-norm causal self-attention, then an MLP, as a sequence of
    pieces whose weights each sit in one cell (one product or one norm). pipe keeps each
    piece's input and differentiates piece by piece, so a weight gradient (W) is that one
    product again, over all micro-batches at once if deferred, and not the whole block's
    forward and backward (pipe.modes)."""
    return nn.SequentialCell([Norm(width), Product(width, 3 * width), Attend(heads),
                              Residual(width, width),
                              Norm(width), Product(width, 4 * width), Gelu(),
                              Residual(4 * width, width)])


class FinalNorm(Norm):
    """(x, keep) -> the layer norm of x: the head's first piece (the stream ends here)."""

    def construct(self, x, keep):
        return self.norm(x)


class Logits(nn.Cell):
    """x -> logits over the bytes, from the input embedding's own table (or, with no
    `embed`, a table of its own)."""

    def __init__(self, width, embed=None):
        super().__init__()
        self.table = embed.token.embedding_table if embed else nn.Embedding(VOCAB, width).embedding_table

    def construct(self, x):
        return product(x, self.table)


def head(width, embed=None):
    """(x, keep) -> logits: the final norm, then the product with the (tied) table."""
    return nn.SequentialCell([FinalNorm(width), Logits(width, embed)])


def gpt_layers(layers=4, width=64, heads=4, context=max(BUCKETS), tied=True):
    """The model as one builder per layer: Embed, `layers` blocks, and the head, tied to
    layer 0 (or, `tied` off, with its own table)."""
    last = Tied(0, lambda embed: head(width, embed)) if tied else (lambda: head(width))
    return ([lambda: Embed(width, context)] +
            [lambda: block(width, heads) for _ in range(layers)] + [last])


def even_blocks(blocks, stages):
    """Layers per (virtual) stage for `gpt_layers`: the blocks split evenly, the embedding
    with the first stage and the head with the last (Megatron's and torch's split; pipe's
    "uniform" counts the embedding and the head as blocks). "uniform" when a stage would
    get no block."""
    if stages > blocks:
        return "uniform"
    counts = [blocks * (s + 1) // stages - blocks * s // stages for s in range(stages)]
    counts[0] += 1
    counts[-1] += 1
    return counts


class TokenLoss(nn.Cell):
    """(logits, targets) -> (summed cross-entropy over targets that are not IGNORE, their count)."""

    def __init__(self):
        super().__init__()
        self.cross_entropy = nn.CrossEntropyLoss(reduction="sum", ignore_index=IGNORE)

    def construct(self, logits, targets):
        total = self.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        return total, (targets != IGNORE).sum().astype(ms.float32)


def optimizer(params, lr):
    """AdamW as nanoGPT sets it up: weight decay on the matrices (the products and the
    embedding tables), none on biases and norm gains. Each stage builds it over its own
    parameters; a stage without one kind leaves that group out (MindSpore refuses it empty)."""
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return nn.AdamWeightDecay([g for g in groups if g["params"]], learning_rate=lr, beta2=0.95)


# ---- the text -----------------------------------------------------------------------------
def paragraphs(context=max(BUCKETS)):
    """Python's documentation as byte strings of 9 to context + 1 bytes (input and target)."""
    from pydoc_data.topics import topics
    out = []
    for key in sorted(topics):
        for text in topics[key].split("\n\n"):
            data = " ".join(text.split()).encode("utf-8")
            out += [data[i:i + context + 1] for i in range(0, len(data), context + 1)]
    return [p for p in out if len(p) > 8]


def held_out(pieces, share=10):
    """(training pieces, validation pieces): the last 1/`share` of the text held out, as
    nanoGPT holds out the end of its text."""
    cut = len(pieces) - len(pieces) // share
    return pieces[:cut], pieces[cut:]


def pad(pieces, length):
    """(ids, targets): each piece's bytes and the next byte, padded to `length`."""
    ids = np.full((len(pieces), length), PAD, np.int32)
    targets = np.full((len(pieces), length), IGNORE, np.int32)
    for row, piece in enumerate(pieces):
        data = np.frombuffer(piece, np.uint8).astype(np.int32)
        ids[row, :len(data) - 1], targets[row, :len(data) - 1] = data[:-1], data[1:]
    return ids, targets


def batches(pieces, batch_size, seed):
    """Endless (ids, targets) batches: each from one bucket, the pieces that fit it."""
    rng = np.random.default_rng(seed)
    buckets = {n: [p for p in pieces if len(p) - 1 <= n and (n == BUCKETS[0] or len(p) - 1 > n // 2)]
               for n in BUCKETS}
    sizes = np.array([len(buckets[n]) for n in BUCKETS], np.float64)
    while True:
        n = BUCKETS[rng.choice(len(BUCKETS), p=sizes / sizes.sum())]
        chosen = rng.choice(len(buckets[n]), batch_size, replace=False)
        yield pad([buckets[n][i] for i in chosen], n)
