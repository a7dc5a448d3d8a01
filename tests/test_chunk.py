"""One model chunk in one process (no MPI): the hand-written backward is the spec here.

Each check runs a `Chunk` through the action handlers the engine runs (pipe.actions, one
by one) and compares it with MindSpore differentiating the same layers directly.
"""
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from pipe.actions import Actions, KeepResiduals, take
from pipe.features.recompute import Recompute
from pipe.layout import make_chunk
from pipe.features.dropout import MaskDraw
from pipe.ops.handshake import probe
from pipe.ops.memory import Held, Memory
from pipe.schedule import lower, one_f_one_b
from pipe.schedules import EVERY
from pipe.split_backward import rows_of

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
rng = np.random.default_rng(0)


def tensor(*shape):
    return ms.Tensor(rng.standard_normal(shape).astype(np.float32))


def reference_grads(layers, x, dy):
    """(dx, weight grads) of the layers applied in order, by MindSpore's own autograd."""
    params = ms.ParameterTuple([p for layer in layers for p in layer.trainable_params()])
    def run(x):
        for layer in layers:
            x = layer(x)
        return x
    dx, dw = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)(run, params)(x, dy)
    return dx[0], dw


def assert_close(got, want):
    np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)


def assert_same_backward(dx, grads, layers, x, dy):
    """The stage's (dx, accumulated weight grads) equal autograd's over `layers`."""
    want_dx, want_dw = reference_grads(layers, x, dy)
    assert_close(dx, want_dx)
    assert len(grads) == len(want_dw)
    for got, want in zip(grads, want_dw):
        assert_close(got, want)


ONE = ms.Tensor(1.0, ms.float32)
OUT, DY, DX = 100, 200, 300       # keys in flight: a micro-batch's output, its gradient, dx


def handlers(stage, micro_batches=2, recompute=False):
    """The handlers of a rank holding `stage` alone, as a middle stage's: its input and
    output gradient come in flight (keys DY + mb), its output and dx go there."""
    layout = SimpleNamespace(chunks=[stage], stage=0, schedule=lower(one_f_one_b(1, micro_batches)),
                             config=SimpleNamespace(micro_batches=micro_batches),
                             keep=Recompute() if recompute else KeepResiduals())
    stage.set_mode(True)                          # (the engine's train_step does this)
    return Actions(layout, None, compiled=False)


def forward(actions, state, mb, x, masks=()):
    return actions.forward(state, mb, 0, None, OUT + mb, ({mb: x}, None, {mb: masks}, ONE))


def backward(actions, state, mb, dy, kind="B", first_sum=True):
    state["flight"][DY + mb] = dy
    data = (None, None, None, ONE)                # (recompute's forward: the kept input)
    state = actions.backward(state, mb, 0, DY + mb, DX + mb, first_sum and kind == "B", data,
                             whole=kind == "B")
    return state, state["flight"][DX + mb]


def one_step(stage, x, dy, split=False, recompute=False):
    """F, then B (or I and W) of one micro-batch: (dx, the chunk's weight gradients)."""
    actions = handlers(stage, recompute=recompute)
    state = forward(actions, actions.start({}, {}), 0, x, stage.masks.learn(x))
    state, dx = backward(actions, state, 0, dy, "I" if split else "B")
    if split:
        state = actions.weight_grad(state, 0, 0, 1)
    return dx, state["grads"][0]


def mlp():
    ms.set_seed(1)
    return [nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 8), nn.Tanh(), nn.Dense(8, 3)]


@pytest.mark.parametrize("mode", ["whole", "split I + W", "recompute"])
def test_per_layer_backward_equals_differentiating_the_slice(mode):
    layers, x, dy = mlp(), tensor(4, 6), tensor(4, 3)
    stage = make_chunk(layers, is_first=False)
    dx, grads = one_step(stage, x, dy, split=mode == "split I + W", recompute=mode == "recompute")
    assert_same_backward(dx, grads, layers, x, dy)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("recompute", [False, True])
def test_deferred_w_over_two_micro_batches_is_the_gradient_of_their_rows(recompute, rows):
    """W* (pipe.schedules.with_deferred_wgrad): two micro-batches' I, then one W over both,
    one product per layer over their rows joined (split_backward.rows_of): the weight
    gradients autograd gives for their rows stacked. What waits for W is only each weighted
    layer's input and output gradient (3 Dense: 6 tensors), `rows` rows each."""
    layers, x, dy = mlp(), tensor(2 * rows, 6), tensor(2 * rows, 3)
    stage = make_chunk(layers, is_first=False)
    actions, dxs = handlers(stage, recompute=recompute), []
    state = actions.start({}, {})
    for mb in (0, 1):
        state = forward(actions, state, mb, x[rows * mb:rows * mb + rows])
    for mb in (0, 1):
        state, dx = backward(actions, state, mb, dy[rows * mb:rows * mb + rows], "I")
        dxs.append(dx)
    assert [len(state["waiting"][mb]) for mb in (0, 1)] == [6, 6]
    assert [t.shape[0] for t in rows_of((state["waiting"][0], state["waiting"][1]))] == [2 * rows] * 6
    state = actions.weight_grad(state, EVERY, 0, 1)
    assert_same_backward(ops.cat(dxs), state["grads"][0], layers, x, dy)


RELUS = {"between Dense layers": [nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 8), nn.ReLU(), nn.Dense(8, 3)],
         "last in the chunk": [nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3), nn.ReLU()],
         "first in the chunk": [nn.ReLU(), nn.Dense(6, 3)]}


@pytest.mark.parametrize("where", RELUS)
@pytest.mark.parametrize("mode", ["whole", "split I + W"])
def test_relu_backward_from_its_output(where, mode):
    """A ReLU keeps no tensor of its own when the next layer keeps its output as input."""
    layers, x = RELUS[where], tensor(4, 6)
    stage = make_chunk(layers, is_first=False)
    dy = tensor(*stage.infer(x).shape)
    dx, grads = one_step(stage, x, dy, split=mode == "split I + W")
    assert_same_backward(dx, grads, layers, x, dy)


def test_a_dense_relu_pair_keeps_one_tensor():
    layers = [nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 8), nn.ReLU(), nn.Dense(8, 3)]
    assert make_chunk(layers).residual_of == [0, 1, 1, 2, 2]
    assert make_chunk([nn.Dense(6, 8), nn.ReLU()]).residual_of == [0, 1]              # last: its own
    assert make_chunk([nn.ReLU(), nn.Dropout(p=0.5), nn.Dense(8, 3)]).residual_of == [0, 1, 2]
    actions, memory = handlers(make_chunk(layers, is_first=False)), Memory()
    state = forward(actions, actions.start(Held(memory, ("kept", None)), {}), 0, tensor(4, 6))
    assert len(state["kept"][0][0]) == 3
    assert memory.peak == 4 * (4 * 6 + 4 * 8 + 4 * 8)            # inputs of the 3 Dense layers


def test_tied_weight_gradients_are_summed():
    ms.set_seed(2)
    shared = nn.Dense(5, 5)
    layers = [shared, nn.Tanh(), shared]
    x, dy = tensor(3, 5), tensor(3, 5)
    dx, grads = one_step(make_chunk(layers, is_first=False), x, dy)
    want_dx, want_dw = reference_grads(layers, x, dy)  # autograd sums both uses itself
    assert len(grads) == 2                             # weight and bias, once each
    assert_close(dx, want_dx)
    assert_close(grads[0], want_dw[0])
    assert_close(grads[1], want_dw[1])


def test_dropout_backward_uses_the_mask_its_forward_drew():
    """Dense(8,64) -> Dropout(0.5) -> Dense(64,4), a batch of one: the units that get no
    gradient are exactly the units the forward dropped."""
    ms.set_seed(3)
    first, dropout, last = nn.Dense(8, 64), nn.Dropout(p=0.5), nn.Dense(64, 4)
    stage = make_chunk([first, dropout, last], is_first=False)
    x, dy = tensor(1, 8), tensor(1, 4)
    stage.masks.learn(x)
    drawn = stage.masks.of(((1, 8), ms.float32), MaskDraw(seed=0, step=1, rows=slice(0, 1), batch_size=1))
    actions = handlers(stage)
    state = forward(actions, actions.start({}, {}), 0, x, drawn)
    mask = state["kept"][0][0][1]                       # what the forward was given, kept
    assert 0 < mask.asnumpy().sum() < 64
    state, dx = backward(actions, state, 0, dy)
    assert_same_backward(dx, state["grads"][0], [first, _Apply(lambda h: h * mask * 2.0), last], x, dy)


class _Apply(nn.Cell):
    """A fixed function as a layer (the dropout with its mask given)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x):
        return self.fn(x)


def batch_norm_stage():
    ms.set_seed(4)
    layers = [nn.Dense(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Dense(5, 3)]
    return layers, make_chunk(layers, is_first=False)


def buffers(stage):
    return [b.asnumpy().copy() for b in stage.buffers]


def test_batch_norm_statistics_move_once_per_forward_only():
    layers, stage = batch_norm_stage()
    twin = nn.BatchNorm1d(5)                        # the same layer, run once by hand
    twin.set_train(True)
    x, dy = tensor(4, 6), tensor(4, 3)
    assert probe(stage, x, None) == (((4, 3), ms.float32), False)
    assert all(np.array_equal(a, b) for a, b in zip(buffers(stage), [np.zeros(5), np.ones(5)]))
    actions = handlers(stage)
    state = forward(actions, actions.start({}, {}), 0, x)
    twin(layers[0](x))
    after_forward = buffers(stage)
    np.testing.assert_allclose(after_forward[0], twin.moving_mean.asnumpy(), rtol=1e-6)
    np.testing.assert_allclose(after_forward[1], twin.moving_variance.asnumpy(), rtol=1e-6)
    backward(actions, state, 0, dy)
    stage.infer(x)
    assert all(np.array_equal(a, b) for a, b in zip(buffers(stage), after_forward))


def test_batch_norm_gradients_use_the_batch_statistics():
    layers, stage = batch_norm_stage()
    x, dy = tensor(4, 6), tensor(4, 3)
    dx, grads = one_step(stage, x, dy)
    for layer in layers:
        layer.set_train(True)
    assert_same_backward(dx, grads, layers, x, dy)


@pytest.mark.parametrize("split", [False, True])
def test_half_precision_relu_after_batch_norm_is_differentiated_at_its_float32_input(split):
    """Batch norm computes in float32 between float16 layers: the ReLU after it gets its
    float32 gradient from its kept input, as autograd over the same cast layers does."""
    layers, _ = batch_norm_stage()
    stage = make_chunk(layers, is_first=False, precision="fp16")       # casts `layers` in place
    x, dy = tensor(4, 6), ms.Tensor(rng.standard_normal((4, 3)).astype(np.float16))
    dx, grads = one_step(stage, x, dy, split)
    for layer in layers:
        layer.set_train(True)
    want_dx, want_dw = reference_grads(layers, x, dy)
    assert dx.dtype == want_dx.dtype == ms.float32 and len(grads) == len(want_dw)
    for got, want in zip((dx, *grads), (want_dx, *want_dw)):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-2, atol=1e-2)   # float16's


def test_infer_runs_in_eval_mode():
    ms.set_seed(5)
    dropout_stage = make_chunk([nn.Dense(4, 4), nn.Dropout(p=0.5)], is_first=False)
    x = tensor(3, 4)
    assert_close(dropout_stage.infer(x), dropout_stage.layers[0](x))    # no dropout


def test_held_bytes_are_read_once_per_step_shapes():
    """The engine names each step's micro-batch shapes (pipe.ops.memory reads an entry's bytes
    once per those): entries of other shapes are counted anew, and taking one gives back
    what it added."""
    actions, memory = handlers(make_chunk([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3)], is_first=False)), Memory()
    for rows in (4, 2, 4):
        state = actions.start(Held(memory, ("kept", ((rows, 6), (rows,)))), {})
        state = forward(actions, state, 0, tensor(rows, 6))
        assert memory.held == 4 * rows * (6 + 8)              # the two Dense layers' inputs
        take(state["kept"], 0)
        assert memory.held == 0
    assert memory.peak == 4 * 4 * (6 + 8)
    assert len(memory.sizes) == 2                             # read once per shapes
