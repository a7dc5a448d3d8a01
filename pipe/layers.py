"""A layer as a pipeline runs it: its forward keeping what its backward reads (its
residuals), and its backward asked of MindSpore at that input, one layer at a time.

`Forward` runs a chunk's layers, each keeping its input (`KeepInput`), and on the model's
last chunk returns the loss and d loss / d logits; `Backward` runs each layer's
vector-Jacobian product at its kept input (`LayerGrad`), last layer first. For a Dense the
forward inside its backward is dead code, which the compiler drops."""
import mindspore as ms
from mindspore import nn, ops

__all__ = ["leaves", "is_plain_sequence", "Sequential", "is_norm", "gradient_positions",
           "per_weight", "add_grads", "with_sums", "residual_indices", "last_first", "KeepInput",
           "LayerGrad", "Differentiable", "has_bool", "arguments", "variable", "Forward",
           "Backward", "Buffers", "KeepsBuffers", "buffers_of"]


def is_plain_sequence(cell):
    """A SequentialCell that only chains its children (one overriding construct is a layer)."""
    chains = type(cell).construct is nn.SequentialCell.construct
    return isinstance(cell, nn.SequentialCell) and chains


def leaves(cells):
    """The innermost layers, in order: inputs are kept at the finest grain."""
    out = []
    for cell in cells:
        out += leaves(list(cell.cells())) if is_plain_sequence(cell) else [cell]
    return out


def arguments(x):
    """A layer's arguments: a tuple's elements (DeepSpeed's convention), or the one tensor."""
    return x if isinstance(x, tuple) else (x,)


class Sequential(nn.SequentialCell):
    """The unsplit model of layers that hand tuples on, what one process trains: as in
    DeepSpeed, a tuple output is the next layer's arguments, and a plain nn.SequentialCell
    layer is chained piece by piece (`leaves`), so the model pipe splits and the one a
    process runs are one function, with nn.SequentialCell's names."""

    def __init__(self, *args):
        super().__init__(*args)
        # (a tuple, not a CellList: not registered again, they keep SequentialCell's names)
        self.pieces = tuple(leaves(list(self.cell_list)))

    def construct(self, x):
        for layer in self.pieces:
            x = layer(*arguments(x))
        return x


def no_bool_gradient(values):   # a bool (a mask): no gradient, as autograd has no bool Add
    return tuple([ops.stop_gradient(v) if v.dtype == ms.bool_ else v for v in values])


def has_bool(values):   # (a constant while compiling: a loop, not any())
    found = False
    for v in values:
        found = found or v.dtype == ms.bool_
    return found


class Differentiable(nn.Cell):
    """A layer differentiated with no bool gradients, used only when a bool reaches it."""

    def __init__(self, layer):
        super().__init__(auto_prefix=False)
        self.layer = layer

    def construct(self, *args):
        y = self.layer(*no_bool_gradient(args))
        return no_bool_gradient(y) if isinstance(y, tuple) else y


def variable(x):
    """A tuple as a graph's input is mutable, or MindSpore folds it in as a constant."""
    return ms.mutable(x) if isinstance(x, tuple) and x else x


class KeepInput(nn.Cell):
    """(x, extras) -> (layer(x), (x,)): the output, and the residuals its backward reads."""
    residual_count = 1

    def __init__(self, layer):
        super().__init__(auto_prefix=False)
        self.layer = layer

    def construct(self, x, extras):
        return self.layer(*arguments(x)), (x,)


class Forward(nn.Cell):
    """(x, labels, scale, extras) -> (output, residuals); on the model's last chunk the output
    is (loss, d loss / d logits x scale), a number scale folded in (at 1, no multiply)."""

    def __init__(self, wrapped, loss_fn=None):
        super().__init__(auto_prefix=False)
        self.layers = nn.CellList(wrapped)
        self.loss_fn = loss_fn
        if loss_fn is not None:
            self.loss_and_grad = ms.value_and_grad(loss_fn, grad_position=0)

    @ms.jit
    def construct(self, x, labels, scale, extras):
        residuals = ()
        for layer in self.layers:
            x, kept = layer(x, extras)
            residuals = residuals + kept
        if self.loss_fn is None:
            return x, residuals
        loss, dlogits = self.loss_and_grad(x, labels)
        if not (isinstance(scale, float) and scale == 1.0):
            dlogits = dlogits * scale
        return (loss, dlogits), residuals


def is_norm(layer):
    """Whether every weight of `layer` is a layer norm's (its gradients come with dx)."""
    owners = [cell for _, cell in layer.cells_and_names() if cell.trainable_params(recurse=False)]
    return bool(owners) and all(isinstance(cell, nn.LayerNorm) for cell in owners)


class LayerGrad(nn.Cell):
    """A layer's backward at its kept input: (x, dy) -> (dx, what it gives beside), dx a
    tuple for a tuple x, none without `input_grad`. Beside dx: B (`weights`) the weight
    gradients; I (no `weights`) what W will read, dy for a layer with weights, or a layer
    norm's weight gradients (its kernel gives them with dx: W only adds them up)."""

    def __init__(self, layer, input_grad=True, weights=True):
        super().__init__(auto_prefix=False)
        self.layer, self.guarded = layer, Differentiable(layer)
        self.weights = ms.ParameterTuple(layer.trainable_params())
        self.input_grad = input_grad
        self.nested = not weights and is_norm(layer)         # I of a norm: (dx, (dw,))
        self.stash = bool(self.weights) and not (weights or self.nested)   # I: dy for W
        with_weights = bool(self.weights) and not self.stash
        self.grad = ops.GradOperation(get_all=input_grad or not with_weights,
                                      get_by_list=with_weights, sens_param=True)

    def construct(self, x, dy):
        layer = self.guarded if has_bool(arguments(x)) else self.layer
        stashed = (dy,) if self.stash else ()
        if not self.input_grad:              # (the chunk's first layer on the first stage)
            if self.stash or not self.weights:
                return dy, stashed
            return dy, self.nest(self.grad(layer, self.weights)(*arguments(x), dy))
        if self.stash or not self.weights:
            dx, given = self.grad(layer)(*arguments(x), dy), stashed
        else:
            dx, given = self.grad(layer, self.weights)(*arguments(x), dy)
        return (dx if isinstance(x, tuple) else dx[0]), self.nest(given)

    def nest(self, given):
        return (given,) if self.nested else given


def residual_indices(pieces):
    """Where each layer's residuals start among all the forward pieces keep."""
    return [sum(piece.residual_count for piece in pieces[:i]) for i in range(len(pieces))]


def last_first(grads, residual_of):
    """The layers' backward cells, last first, each knowing its residual's index."""
    for grad, index in zip(grads, residual_of):
        grad.residual = index
    return grads[::-1]


def gradient_positions(layers):
    """Per distinct parameter, its gradients' positions in the layers' list (a shared one: 2);
    None when no parameter is shared: nothing to sum, and no gather to compile
    (docs/performance.md, "Time to the first step")."""
    positions, k = {}, 0
    for layer in layers:
        for p in layer.trainable_params():
            positions.setdefault(id(p), []).append(k)
            k += 1
    if all(len(ks) == 1 for ks in positions.values()):
        return None
    return tuple(tuple(ks) for ks in positions.values())


def per_weight(grads, positions):
    """Each weight's gradient: the sum of the layers' gradients at positions[u] (None: the
    layers' gradients are the weights')."""
    if positions is None:
        return grads
    summed = ()
    for u in range(len(positions)):
        total = grads[positions[u][0]]
        for k in positions[u][1:]:
            total = total + grads[k]
        summed = summed + (total,)
    return summed


ADD_EACH = ops.HyperMap()


@ms.jit
def add_grads(sums, grads):
    """sums + grads, outside the backward (which then compiles once, not twice); one
    HyperMap, which compiles faster than a loop over the tensors (docs/performance.md)."""
    return ADD_EACH(ops.add, sums, grads)


def with_sums(sums, grads, first_sum):
    """The sums after a backward: its `grads` if the step's first, else sums + grads."""
    return grads if first_sum else add_grads(variable(sums), variable(grads))


class Backward(nn.Cell):
    """(dy, *residuals) -> (dx, what the layers' backward pieces give beside dx, in layer
    order): B's, this micro-batch's weight gradients, summed per weight at `positions`
    (gradient_positions); I's (pipe.split_backward, no `positions`), what W will read."""

    def __init__(self, layer_grads, positions=None):
        super().__init__(auto_prefix=False)
        self.reversed_grads = nn.CellList(layer_grads)
        self.positions = positions

    @ms.jit
    def construct(self, dy, *residuals):     # as *args: MindSpore 2.10 cannot
        given = ()                            # differentiate at a tuple's element
        for layer_grad in self.reversed_grads:
            dy, out = layer_grad(residuals[layer_grad.residual], dy)
            given = out + given
        return dy, per_weight(given, self.positions)


def buffers_of(layers):
    """The layers' buffers (untrainable parameters), each once."""
    return list({id(b): b for layer in layers for b in layer.untrainable_params()}.values())


class Buffers(nn.Cell):
    """Layers' buffers, saved and put back as they were (`KeepsBuffers`)."""

    def __init__(self, buffers):
        super().__init__(auto_prefix=False)
        self.values = ms.ParameterTuple(buffers)

    def save(self):
        """A copy of each buffer's value now."""
        return tuple([ops.deepcopy(buffer.value()) for buffer in self.values])

    def put_back(self, copies, after):
        """Each buffer assigned its saved copy in place, once `after` is done."""
        for buffer, copy in zip(self.values, copies):
            ops.assign(buffer, ops.depend(copy, after))
        return after


class KeepsBuffers(nn.Cell):
    """A backward piece that moves no buffer: it runs layers' forwards again, which would move
    batch norm's statistics a second time, so each buffer is put back after it."""

    def __init__(self, cell, buffers):
        super().__init__(auto_prefix=False)
        self.cell, self.kept = cell, Buffers(buffers)

    def construct(self, *args):
        copies = self.kept.save()
        out = self.cell(*args)
        self.kept.put_back(copies, out)
        return out
