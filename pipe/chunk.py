"""One model chunk: compiled forward and backward over a slice of the model's layers.

A chunk is the layers of one virtual stage (pipe.schedule); with one chunk per rank, it is
the rank's whole pipeline stage. It runs each micro-batch's forward once and keeps, for
each layer, the input it saw:
the same tensors autograd would keep. Its backward walks the layers in reverse and asks
MindSpore for each layer's vector-Jacobian product at that saved input, all inside one
compiled graph. Layers whose gradient needs no forward output (Dense: dX = dY W^T,
dW = dY^T X) are not recomputed: their forward is dead code in the backward graph and the
compiler drops it. So a chunk runs forward + backward at ~3x the forward's cost, not the
~4x of differentiating the whole chunk again from its input.

Two kinds of layer need more than that. Dropout takes its mask as an input (drawn on the
host, see pipe.dropout) and keeps it instead of its input: the backward multiplies by the
same mask. Layers with buffers (batch norm's moving statistics) update them when run in
training mode; the backward runs them again, so the chunk puts the buffers back as they
were after every backward.

(`ms.jit` returns tensors, not a closure over the forward, and PyNative `ms.vjp` keeps
one but runs op by op; see docs/benchmarks.md for the measurements behind this choice.)
"""
from contextlib import contextmanager

import mindspore as ms
import numpy as np
from mindspore import nn, ops

__all__ = ["Chunk", "RandomLayer", "leaves", "is_plain_sequence"]


def is_plain_sequence(cell):
    """A SequentialCell that only chains its children: one whose class overrides
    `construct` (a skip connection, say) is a layer of its own, not a list of layers."""
    return isinstance(cell, nn.SequentialCell) and type(cell).construct is nn.SequentialCell.construct


def leaves(cells):
    """The innermost layers, in order: nested plain `SequentialCell`s are flattened so
    activations are kept at the finest grain (a Dense and its ReLU separately)."""
    out = []
    for cell in cells:
        out += leaves(list(cell.cells())) if is_plain_sequence(cell) else [cell]
    return out


def keeps_mask(layer):
    return type(layer) is nn.Dropout


def keeps_output(layer):
    """ReLU's gradient needs only its output: it passes dy where the output is > 0. As
    relu(y) = y there, the layer's own backward run at its output y gives exactly the
    gradient at its input. That output is the next layer's input, kept anyway: a Dense +
    ReLU pair holds one tensor, as in autograd."""
    return type(layer) is nn.ReLU


def residual_indices(layers):
    """For each layer, the index of its residual in the forward's saved tuple, and how many
    tensors that tuple holds. A ReLU shares the next layer's index when that layer keeps its
    input (its own output); otherwise (last in the chunk, or before a dropout) it keeps its
    output at an index of its own."""
    indices, count = [], 0
    for i, layer in enumerate(layers):
        indices.append(count)
        following = layers[i + 1] if i + 1 < len(layers) else None
        if not (keeps_output(layer) and following is not None and not keeps_mask(following)):
            count += 1
    return tuple(indices), count


class _KeepInput(nn.Cell):
    """(x, masks) -> (layer(x), x): what the layer's backward is computed from."""
    kept = True

    def __init__(self, layer):
        super().__init__(auto_prefix=False)
        self.layer = layer

    def construct(self, x, masks):
        return self.layer(x), x


class _KeepOutput(_KeepInput):
    """ReLU: (x, masks) -> (y, y); `kept` False when the next layer keeps y as its input."""

    def __init__(self, layer, kept):
        super().__init__(layer)
        self.kept = kept

    def construct(self, x, masks):
        y = self.layer(x)
        return y, y


class _KeepMask(nn.Cell):
    """Dropout: (x, masks) -> (x * mask / keep_prob, mask), with its own mask of `masks`."""
    kept = True

    def __init__(self, dropout, index):
        super().__init__(auto_prefix=False)
        self.index = index
        self.scale = 1.0 / dropout.dropout.keep_prob

    def construct(self, x, masks):
        mask = masks[self.index]
        return x * mask * self.scale, mask


class _Forward(nn.Cell):
    """(x, labels, scale, dropout masks) -> (output, residuals: each layer's input, a
    dropout's mask, or a ReLU's output unless the next layer's input is that output). On
    the model's last chunk the output is (loss, d loss / d logits x scale): the loss
    gradient is cheap, and starting the backward from it means the logits need not be
    kept."""

    def __init__(self, layers, loss_fn=None):
        super().__init__(auto_prefix=False)
        random = [i for i, layer in enumerate(layers) if keeps_mask(layer)]
        place, _ = residual_indices(layers)
        own = [i + 1 == len(layers) or place[i + 1] > place[i] for i in range(len(layers))]
        self.layers = nn.CellList([
            _KeepMask(l, random.index(i)) if i in random else
            _KeepOutput(l, own[i]) if keeps_output(l) else _KeepInput(l)
            for i, l in enumerate(layers)])
        self.loss_fn = loss_fn
        if loss_fn is not None:
            self.loss_and_grad = ms.value_and_grad(loss_fn, grad_position=0)

    @ms.jit
    def construct(self, x, labels, scale, masks):
        saved = ()
        for layer in self.layers:
            x, residual = layer(x, masks)
            if layer.kept:
                saved = saved + (residual,)
        if self.loss_fn is None:
            return x, saved
        loss, dlogits = self.loss_and_grad(x, labels)
        return (loss, dlogits * scale), saved


class _Infer(nn.Cell):
    """x -> the chunk's output, keeping nothing (layers in eval mode: no dropout, batch
    norm from its moving statistics)."""

    def __init__(self, layers):
        super().__init__(auto_prefix=False)
        self.layers = nn.CellList(layers)

    @ms.jit
    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def gradient_positions(layers):
    """For each distinct parameter of `layers` (first use order), the positions of its
    gradients in the per-layer gradient list: a weight used by two layers (a tied embedding
    and output head) gets both gradients summed."""
    positions, order = {}, []
    k = 0
    for layer in layers:
        for p in layer.trainable_params():
            if id(p) not in positions:
                positions[id(p)] = []
                order.append(id(p))
            positions[id(p)].append(k)
            k += 1
    return tuple(tuple(positions[i]) for i in order)


def _accumulate(accumulators, grads, positions):
    """accumulators[u] + the gradients at positions[u], for every parameter u (unrolled).
    The step's first backward passes no accumulators (an empty tuple, compiled as its own
    graph) and gets the gradients themselves: nothing to zero, nothing to add."""
    summed = ()
    for u in range(len(positions)):
        total = grads[positions[u][0]]
        for k in positions[u][1:]:
            total = total + grads[k]
        summed = summed + ((accumulators[u] + total) if accumulators else total,)
    return summed


class _MaskGrad(nn.Cell):
    """Dropout's backward from its kept mask: (mask, dy) -> (dy * mask / keep_prob, ())."""

    def __init__(self, dropout):
        super().__init__(auto_prefix=False)
        self.scale = 1.0 / dropout.dropout.keep_prob

    def construct(self, mask, dy):
        return dy * mask.astype(dy.dtype) * self.scale, ()


def _layer_grads(layers, make, input_grad):
    """The per-layer backward cells, last layer first, each knowing the index of its
    residual. The first layer of the model needs no input gradient (`input_grad` False)
    and the compiler then skips computing it."""
    grads = [_MaskGrad(layer) if keeps_mask(layer) else make(layer, input_grad or i > 0)
             for i, layer in enumerate(layers)]
    for grad, index in zip(grads, residual_indices(layers)[0]):
        grad.residual = index
    return nn.CellList(grads[::-1])


class _LayerGrad(nn.Cell):
    """(x, dy) -> (dx, weight grads) for one layer. With `input_grad=False` dx is not needed
    (the first layer of the model) and the compiler skips computing it."""

    def __init__(self, layer, input_grad=True):
        super().__init__(auto_prefix=False)
        self.layer = layer
        self.weights = ms.ParameterTuple(layer.trainable_params())
        self.input_grad = input_grad
        self.grad = ops.GradOperation(get_all=input_grad, get_by_list=bool(self.weights),
                                      sens_param=True)

    def construct(self, x, dy):
        if not self.weights:
            return self.grad(self.layer)(x, dy)[0], ()
        if not self.input_grad:
            return dy, self.grad(self.layer, self.weights)(x, dy)
        dx, dw = self.grad(self.layer, self.weights)(x, dy)
        return dx[0], dw


class _Backward(nn.Cell):
    """(dy, grad accumulators, residuals) -> (dx, accumulators + this micro-batch's grads)."""

    def __init__(self, layers, input_grad):
        super().__init__(auto_prefix=False)
        self.reversed_grads = _layer_grads(layers, _LayerGrad, input_grad)
        self.positions = gradient_positions(layers)

    @ms.jit
    def construct(self, dy, accumulators, *saved):
        grads = ()
        for layer_grad in self.reversed_grads:  # residuals arrive as *args: MindSpore 2.10
            dy, dw = layer_grad(saved[layer_grad.residual], dy)   # cannot differentiate at a
            grads = dw + grads                                # tuple's element
        return dy, _accumulate(accumulators, grads, self.positions)


class _LayerInputGrad(nn.Cell):
    """(x, dy) -> (dx, what W will need: (dy,) for a layer with weights, else ())."""

    def __init__(self, layer, input_grad=True):
        super().__init__(auto_prefix=False)
        self.layer = layer
        self.keep = bool(layer.trainable_params())
        self.input_grad = input_grad
        self.grad = ops.GradOperation(get_all=True, sens_param=True)

    def construct(self, x, dy):
        stash = (dy,) if self.keep else ()
        if not self.input_grad:
            return dy, stash
        return self.grad(self.layer)(x, dy)[0], stash


class _InputGrad(nn.Cell):
    """B of a split backward: (dy, residuals) -> (dx, output gradients of the layers with
    weights). No weight gradient is computed: the compiler drops dW."""

    def __init__(self, layers, input_grad):
        super().__init__(auto_prefix=False)
        self.reversed_grads = _layer_grads(layers, _LayerInputGrad, input_grad)

    @ms.jit
    def construct(self, dy, *saved):
        stashed = ()
        for layer_grad in self.reversed_grads:
            dy, stash = layer_grad(saved[layer_grad.residual], dy)
            stashed = stash + stashed
        return dy, stashed


class _WeightGrad(nn.Cell):
    """W of a split backward: (accumulators, the inputs of the layers with weights, their
    stashed output gradients) -> accumulators + the weight gradients over those rows. Each
    is dY^T X for a Dense: no input gradient, no forward recomputed."""

    def __init__(self, layers):
        super().__init__(auto_prefix=False)
        weighted = [(i, layer) for i, layer in enumerate(layers) if layer.trainable_params()]
        indices, _ = residual_indices(layers)
        self.inputs = tuple(indices[i] for i, _ in weighted)  # the residuals W reads
        self.layers = nn.CellList([layer for _, layer in weighted])
        self.weights = [ms.ParameterTuple(layer.trainable_params()) for _, layer in weighted]
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.positions = gradient_positions(layers)

    @ms.jit
    def construct(self, accumulators, *tensors):   # tensors: layer inputs, then their dys
        grads = ()
        n = len(self.layers)
        for k in range(n):
            grads = grads + self.grad(self.layers[k], self.weights[k])(tensors[k], tensors[n + k])
        return _accumulate(accumulators, grads, self.positions)


def _nbytes(entry):
    """Bytes of the tensors in a saved entry (nested tuples, None, labels)."""
    if isinstance(entry, (tuple, list)):
        return sum(_nbytes(e) for e in entry)
    return entry.nbytes if isinstance(entry, ms.Tensor) else 0


def distinct(parameters):
    return list({id(p): p for p in parameters}.values())


class Chunk:
    """A slice of the model on this rank, with its in-flight activations and its gradients.

    `forward(mb, x)` returns the activation for the next chunk (on the model's last: the
    loss), `backward(mb, dy)` the gradient for the previous one, and accumulates weight gradients
    over the micro-batches of a step, scaled so their sum is the step's mean gradient.
    Training calls run the layers in training mode, `infer` in eval mode.

    With `recompute`, a micro-batch in flight keeps only its input (and dropout
    masks); the backward runs the forward again to get the layer inputs back (activation
    recomputation: less memory, one more forward). `peak_bytes` is the most activation
    memory held at once. `first_layer` is the chunk's place in the whole model: it names
    the dropout layers whose masks it draws.
    """

    def __init__(self, layers, loss_fn=None, is_first=True, grad_scale=1.0, recompute=False,
                 first_layer=0):
        self.layers = leaves(layers)
        self.params = distinct(p for layer in self.layers for p in layer.trainable_params())
        self.buffers = distinct(p for layer in self.layers for p in layer.untrainable_params())
        self.named = [(first_layer + i, j)     # (layer of the model, leaf within it)
                      for i, layer in enumerate(layers) for j in range(len(leaves([layer])))]
        self.dropouts = [(k, self.named[k], layer.dropout.keep_prob)
                         for k, layer in enumerate(self.layers) if keeps_mask(layer)]
        self._mask_shapes = {}  # input shape -> each dropout layer's input shape
        self.is_last, self.loss_fn = loss_fn is not None, loss_fn
        self.forward_cell = _Forward(self.layers, loss_fn)
        self.infer_cell = _Infer(self.layers)
        self.backward_cell = _Backward(self.layers, input_grad=not is_first)
        self.input_grad_cell = _InputGrad(self.layers, input_grad=not is_first)
        self.weight_grad_cell = _WeightGrad(self.layers)
        self.grad_scale = ms.Tensor(grad_scale, ms.float32)
        self.no_labels = ms.Tensor(0, ms.int32)
        self.recompute = recompute
        self.training = None   # the mode the layers are in
        self.residuals = {}    # micro-batch -> (its layers' residuals, the gradient to start
                               # from), from its F until its B
        self.waiting = {}      # micro-batch -> what its W reads (the inputs and output
                               # gradients of the layers with weights), from its B until its W
        self._keys, self._sizes = {}, {}   # micro-batch -> kind of its entry; kind -> bytes
        self.grads = ()        # accumulated weight gradients, in `params` order (() at a step's start)
        self.held_bytes = self.peak_bytes = 0

    @property
    def state(self):
        """What a checkpoint holds of this chunk: parameters, then buffers."""
        return self.params + self.buffers

    def set_mode(self, training):
        if self.training != training:
            for layer in self.layers:
                layer.set_train(training)
            self.training = training

    @contextmanager
    def _buffers_kept(self):
        """Put the buffers back as they were: the backward runs layers a second time."""
        before = [b.value().copy() for b in self.buffers]
        yield
        for buffer, value in zip(self.buffers, before):
            ops.assign(buffer, value)        # in place: compiled graphs hold its storage

    def zero_grads(self):
        """Start a step: its first backward's gradients become the accumulators."""
        self.grads = ()

    def _accumulators(self):
        return ms.mutable(self.grads) if self.grads else ()

    def forward(self, mb, x, labels=None, draw=None):
        """`draw` (a pipe.dropout.MaskDraw) says which dropout masks this micro-batch gets;
        None keeps every unit."""
        self.set_mode(True)
        masks = self._masks(x, draw)
        given = self.no_labels if labels is None else labels
        out, saved = self.forward_cell(x, given, self.grad_scale, masks)
        if self.recompute:
            self._keep(self.residuals, mb, ((x, masks), labels), ("input", x.shape))   # input only
        elif self.is_last:
            self._keep(self.residuals, mb, (saved, out[1]), ("F", x.shape))   # d loss / d logits
        else:
            self._keep(self.residuals, mb, (saved, None), ("F", x.shape))
        return out[0] if self.is_last else out

    def backward(self, mb, dy=None):
        with self._buffers_kept():
            saved, start = self._restore(mb)
            dx, self.grads = self.backward_cell(start if self.is_last else dy, self._accumulators(), *saved)
        return dx

    def backward_input(self, mb, dy=None):
        """B of a split backward: the gradient for the previous chunk only. What W needs
        (the input and output gradient of each layer with weights) waits in `waiting` until
        `backward_weight`."""
        key = ("W", self._keys[mb][1])
        with self._buffers_kept():
            saved, start = self._restore(mb)
            dx, stashed = self.input_grad_cell(start if self.is_last else dy, *saved)
        read = tuple(saved[i] for i in self.weight_grad_cell.inputs)
        self._keep(self.waiting, mb, read + stashed, key)
        return dx

    def backward_weight(self, mbs):
        """W of a split backward for the micro-batches `mbs`, accumulated: with several
        (a W deferred to the flush), one product per layer over all their rows."""
        waiting = [self._take(self.waiting, mb) for mb in mbs]
        rows = waiting[0] if len(waiting) == 1 else tuple(ops.cat(t) for t in zip(*waiting))
        with self._buffers_kept():
            self.grads = self.weight_grad_cell(self._accumulators(), *rows)

    def _restore(self, mb):
        """The layer residuals of micro-batch `mb` (recomputed if only the input was kept)."""
        kept, extra = self._take(self.residuals, mb)
        if not self.recompute:
            return kept, extra
        x, masks = kept
        labels = self.no_labels if extra is None else extra
        out, saved = self.forward_cell(x, labels, self.grad_scale, masks)
        return saved, out[1] if self.is_last else None

    def _masks(self, x, draw):
        """The dropout layers' keep masks for input `x`, in layer order."""
        if self.dropouts and x.shape not in self._mask_shapes:
            self._mask_shapes[x.shape] = self._input_shapes(x)
        return self.dropout_masks(x.shape, draw)

    def dropout_masks(self, shape, draw):
        """The dropout layers' keep masks for an input of `shape` that this chunk has seen
        (`probe` runs it on its first), in layer order. `draw` None keeps every unit."""
        if not self.dropouts:
            return ()
        shapes = self._mask_shapes[shape]
        if draw is None:
            return tuple(ops.ones(shapes[k], ms.float32) for k, _, _ in self.dropouts)
        return tuple(draw.keep(name, shapes[k], keep) for k, name, keep in self.dropouts)

    def _input_shapes(self, x):
        """Every layer's input shape, from one eager pass in eval mode (nothing moves)."""
        self.set_mode(False)
        shapes = []
        for layer in self.layers:
            shapes.append(x.shape)
            x = layer(x)
        self.set_mode(True)
        return shapes

    def _keep(self, store, mb, entry, key):
        """Hold `entry` for micro-batch `mb` in `store` (`residuals` or `waiting`). Its
        bytes are counted once per `key` (what it holds, for which input shape): every
        micro-batch of a step has the same shapes, and reading a tensor's size on a device
        can wait for the device."""
        if key not in self._sizes:
            self._sizes[key] = _nbytes(entry)
        store[mb], self._keys[mb] = entry, key
        self.held_bytes += self._sizes[key]
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def _take(self, store, mb):
        self.held_bytes -= self._sizes[self._keys.pop(mb)]
        return store.pop(mb)

    def infer(self, x):
        """Forward only, in eval mode, keeping nothing: the model's output on the last chunk."""
        self.set_mode(False)
        return self.infer_cell(x)

    def probe(self, x, labels, training=True):
        """Run the forward on `x` as a step will (compiling it), keeping nothing and leaving
        the buffers as they were. Returns the (shape, dtype) of this chunk's output (on the
        model's last chunk, the logits'). In training mode it runs twice and raises
        `RandomLayer` if the two differ: a layer drawing its own random numbers would draw
        others when its backward runs it again. (`predict` probes in eval mode, no loss.)"""
        self.set_mode(training)
        if not training:
            out = self.infer_cell(x)
            return tuple(out.shape), out.dtype
        labels = self.no_labels if labels is None else labels
        with self._buffers_kept():
            masks = self._masks(x, None)
            runs = [self.forward_cell(x, labels, self.grad_scale, masks)[0] for _ in range(2)]
        if not _same(*runs):
            raise RandomLayer(f"{self._random_layer(x)} draws random numbers inside: two runs "
                              "of its forward on the same input differ, and pipe's backward "
                              "runs it again, drawing others; make each dropout an nn.Dropout "
                              "layer of its own (pipe draws its mask once per micro-batch)")
        out = runs[0][1] if self.is_last else runs[0]
        return tuple(out.shape), out.dtype

    def _random_layer(self, x):
        """The first layer whose output differs between two eager runs on the same input."""
        with self._buffers_kept():
            for k, layer in enumerate(self.layers):
                y = layer(x)
                if not keeps_mask(layer) and not _same(y, layer(x)):
                    return self.describe_layer(k)
                x = y
        return f"a layer of {self.describe_layer(0)} to {self.describe_layer(len(self.layers) - 1)}"

    def describe_layer(self, k):
        """Leaf layer k as a user knows it: its index in the whole model (and its place
        within that layer, when pipe split a nested SequentialCell), and its class."""
        i, j = self.named[k]
        part = f".{j}" if sum(1 for n in self.named if n[0] == i) > 1 else ""
        return f"layer {i}{part} ({type(self.layers[k]).__name__})"

    def locate_failure(self, x, labels):
        """Where the training forward fails on `x` when run eagerly, piece by piece:
        (k, what, its exception) for leaf layer k, or k = len(layers) for the loss; None
        when every piece runs alone (the failure is in compiling them together)."""
        self.set_mode(True)
        with self._buffers_kept():
            for k, layer in enumerate(self.layers):
                try:
                    y = layer(x)
                except Exception as error:       # the user's code: any exception
                    return k, f"{self.describe_layer(k)}, given {_spec(x)}", error
                x = y
            if self.is_last and labels is not None:
                try:
                    self.loss_fn(x, labels)
                except Exception as error:
                    return len(self.layers), f"loss_fn, given logits of {_spec(x)} and " \
                                             f"labels of {_spec(labels)}", error
        return None


class RandomLayer(TypeError):
    """A layer draws random numbers inside: pipe's backward would run it again and draw others."""


def _spec(x):
    """What a piece was given, in words: `shape (4, 8) Float32`, or what it was instead."""
    if isinstance(x, ms.Tensor):
        return f"shape {tuple(x.shape)} {x.dtype}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"


def _flat(out):
    """The tensors of a forward's output, nested tuples flattened."""
    if isinstance(out, (tuple, list)):
        return [t for part in out for t in _flat(part)]
    return [out]


def _same(one, other):
    """Whether two runs' outputs are equal, bit for bit (NaN equal to NaN)."""
    return all(np.array_equal(a.asnumpy(), b.asnumpy(), equal_nan=True)
               for a, b in zip(_flat(one), _flat(other)))
