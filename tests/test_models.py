"""A user's own model: what pipe refuses (with the fix), and the CNN of examples/mnist/cnn.py
(batch norm, a skip connection, dropout) trained like one process. (Dropout's masks agree
between forward and backward: tests/test_chunk.py.)

The refusals and clipping run in this process; the CNN layouts in the one mpiexec launch
the matrices share (conftest.trained).
"""
import os

import mindspore as ms
import numpy as np
import pytest
from launch import load, loop_config, results
from mindspore import nn, ops
from user_layers import GraphOnly, HiddenDropout

from pipe.layout import make_chunk
from pipe.engine import PipelineEngine
from pipe.ops.deadlines import DeadlineWire
from pipe.ops.handshake import HALF_HINT, unwired

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


class Residual(nn.SequentialCell):
    """A skip connection written as a SequentialCell subclass: pipe cannot split this."""

    def construct(self, x):
        return x + super().construct(x)


class NoisyBlock(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense, self.dropout = nn.Dense(4, 4), nn.Dropout(p=0.5)

    def construct(self, x):
        return self.dropout(self.dense(x))


def engine(model, **config):
    return PipelineEngine(model, LOSS, lambda ps: nn.SGD(ps, learning_rate=0.1),
                          loop_config(batch_size=4, **config))


@pytest.mark.parametrize("model,message", [
    (nn.Dense(4, 4), "pipe splits an nn.SequentialCell into stages, layer by layer; the model is "
                     "a Dense: list its layers in an nn.SequentialCell"),
    (Residual([nn.Dense(4, 4)]), "the model is a Residual, a SequentialCell subclass with its own "
                                 "construct: pipe would split it by its children and skip that "
                                 "construct; wrap the block with the skip connection as one layer "
                                 "of a plain nn.SequentialCell"),
    (nn.SequentialCell([nn.Dense(4, 4, dtype=ms.float16)]),
     "parameter '0.weight' of layer 0 is Float16: pipe keeps float32 master weights (the "
     "optimizer's small steps vanish in float16); build the layer in float32 and set "
     "precision='fp16' for float16 compute"),
    (ms.amp.auto_mixed_precision(nn.SequentialCell([nn.Dense(4, 4)]), "auto"),
     "the model is set for mindspore.amp.auto_mixed_precision (level 'auto'), which its layers "
     "lose when pipe cuts it into stages: pass it as built and set precision='fp16' (pipe casts "
     "every layer to float16 and scales the loss)"),
    (nn.SequentialCell([nn.Dense(4, 4), nn.SequentialCell([nn.ReLU(), ms.amp.auto_mixed_precision(
        nn.SequentialCell([nn.Dense(4, 4)]), "auto")])]),
     "layer 1.1 is set for mindspore.amp.auto_mixed_precision (level 'auto'), which its layers "
     "lose when pipe cuts it into stages: pass it as built and set precision='fp16' (pipe casts "
     "every layer to float16 and scales the loss)"),
])
def test_models_pipe_cannot_split_are_refused(model, message):
    with pytest.raises(TypeError) as err:
        engine(model)
    assert str(err.value) == message


def test_an_optimizer_built_and_a_batch_not_one_array_are_refused_with_the_fix():
    """An nn.Optimizer is a Cell, so callable: taken for `make_optimizer`, it was run on the
    parameters as if they were gradients. A list has no dtype: it failed inside pipe. Arrays
    side by side (ids and a mask) are one array to pipe, which cuts its rows."""
    model = nn.SequentialCell([nn.Dense(4, 4), nn.Dense(4, 3)])
    with pytest.raises(TypeError) as err:
        PipelineEngine(model, LOSS, nn.Adam(model.trainable_params(), 1e-3),
                       loop_config(batch_size=4))
    assert str(err.value) == ("make_optimizer is an optimizer (Adam): pass a function of a stage's "
                              "parameters, lambda ps: nn.Adam(ps)")
    pipe = engine(model)
    for call in (lambda: pipe.train_step([[0.0] * 4] * 4, np.zeros(4, np.int32)),
                 lambda: pipe.predict([[0.0] * 4] * 4)):
        with pytest.raises(TypeError) as err:
            call()
        assert str(err.value) == ("the batch's inputs must be a numpy array or a MindSpore "
                                  "Tensor, not a list: pass np.asarray(inputs)")
    ids, mask = np.zeros((4, 4), np.float32), np.ones((4, 4), np.float32)
    for call, fix in ((lambda: pipe.train_step((ids, mask), np.zeros(4, np.int32)),
                       "a tuple: pass np.stack(inputs, axis=1), and take them apart in the first "
                       "layer"),
                      (lambda: pipe.train_step(ids, [np.zeros(4, np.int32)] * 2),
                       "a list: pass np.stack(labels, axis=1), and take them apart in loss_fn")):
        with pytest.raises(TypeError) as err:      # (before their lengths: 2 rows, it seemed)
            call()
        assert str(err.value).split("Tensor, not ")[1] == fix


class Tempered(nn.Cell):
    """Cross entropy of logits / t, t learned: one process trains t with the model."""

    def __init__(self):
        super().__init__()
        self.t = ms.Parameter(ms.Tensor(1.0, ms.float32), name="t")

    def construct(self, logits, labels):
        return LOSS(logits / self.t, labels)


def test_a_loss_with_weights_is_refused():
    """pipe steps the model's layers' parameters, never the loss's: they stayed put."""
    with pytest.raises(TypeError) as err:
        PipelineEngine(nn.SequentialCell([nn.Dense(4, 3)]), Tempered(), lambda ps: nn.SGD(ps),
                       loop_config(batch_size=4))
    assert str(err.value) == ("loss_fn holds weights ('t') pipe would not train (it trains the "
                              "model's layers): move them into the last layer")


def decayed(params):
    """AdamWeightDecay with two parameter groups chosen by whole-model name (weights decay,
    biases and norms not) and a learning rate schedule: MindSpore orders the groups' parameters
    group by group, not as they were given."""
    weights = [p for p in params if p.name.endswith("weight")]
    others = [p for p in params if not p.name.endswith("weight")]
    return nn.AdamWeightDecay([{"params": weights, "weight_decay": 0.1}, {"params": others}],
                              learning_rate=nn.CosineDecayLR(0.0, 0.05, 10))


def beside_one_process(build, make_optimizer, rows, **config):
    """(pipe, TrainOneStepCell's weights by name) after 3 steps on one batch of `rows`
    samples (6 features, 3 classes), each from a model of `build`."""
    rng = np.random.default_rng(rows)
    x = ms.Tensor(rng.standard_normal((rows, 6)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 3, rows).astype(np.int32))
    whole = build()
    optimizer = make_optimizer(whole.trainable_params())
    step = nn.TrainOneStepCell(nn.WithLossCell(whole, LOSS), optimizer)
    pipe = PipelineEngine(build(), LOSS, make_optimizer, loop_config(batch_size=rows, **config))
    for _ in range(3):
        step(x, y)
        pipe.train_step(x, y)
    return pipe, {p.name: p.asnumpy() for p in whole.get_parameters()}


class Squashed(nn.Cell):
    """tanh(dense(x)) of a Dense given to it: two of them may share one."""

    def __init__(self, dense):
        super().__init__()
        self.dense = dense

    def construct(self, x):
        return ops.tanh(self.dense(x))


def test_a_cell_used_twice_trains_as_one_process_and_keeps_mindspore_s_name(tmp_path):
    """Its weight takes the name of the last place it is used (`2.dense.weight`), as
    MindSpore's own checkpoints name it: model.ckpt loads whole into the unsplit model."""
    def build():
        ms.set_seed(3)
        shared = nn.Dense(8, 8)
        return nn.SequentialCell([nn.Dense(6, 8), Squashed(shared), Squashed(shared), nn.Dense(8, 3)])
    pipe, want = beside_one_process(build, lambda ps: nn.SGD(ps, 0.5), 4, micro_batches=2)
    assert sorted(pipe.parameters_dict()) == sorted(want)
    for name, got in pipe.parameters_dict().items():
        np.testing.assert_allclose(got.asnumpy(), want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    pipe.save(str(tmp_path), 3)
    assert ms.load_param_into_net(build(), ms.load_checkpoint(str(tmp_path / "model.ckpt"))) == ([], [])


@pytest.mark.parametrize("one_graph", [False, True])
def test_an_optimizer_with_parameter_groups_steps_as_in_one_process(one_graph):
    """Each gradient goes to its parameter in the optimizer's own order: bit for bit what
    TrainOneStepCell does, over 3 steps of the schedule."""
    def build():
        ms.set_seed(5)
        return nn.SequentialCell([nn.Dense(6, 8), nn.LayerNorm((8,)), nn.ReLU(), nn.Dense(8, 3)])
    pipe, want = beside_one_process(build, decayed, 4, micro_batches=1, one_graph=one_graph)
    for name, got in pipe.parameters_dict().items():
        np.testing.assert_array_equal(got.asnumpy(), want[name], err_msg=name)


@pytest.mark.parametrize("make,held", [
    (lambda ps: nn.Adam(ps[:1]), "over 1 parameters, 1 of the 4"),
    (lambda ps: nn.Adam(list(ps) + nn.Dense(2, 2).trainable_params()),
     "over 6 parameters, 4 of the 4"),
])
def test_an_optimizer_over_other_parameters_than_the_stage_s_is_refused(make, held):
    """pipe hands the optimizer one gradient for each parameter it gave make_optimizer."""
    with pytest.raises(ValueError) as err:
        PipelineEngine(nn.SequentialCell([nn.Dense(4, 4), nn.Dense(4, 3)]), LOSS, make,
                       loop_config(batch_size=4))
    assert str(err.value) == (f"make_optimizer built an optimizer {held} it was given: build it "
                              "over exactly those (freeze a weight: requires_grad = False)")


def test_a_skip_connection_as_one_layer_is_kept_whole():
    block = Residual([nn.Dense(4, 4)])
    stage = make_chunk([nn.Dense(4, 4), block], is_first=False)
    assert stage.layers[1] is block


def trained_with_dropout(seed=0, rejected_first=False, **config):
    """The weights after 3 steps of an MLP with dropout (p=0.5) on one process (after a
    batch of the wrong size was refused, with `rejected_first`)."""
    ms.set_seed(7)
    model = nn.SequentialCell([nn.Dense(6, 16), nn.ReLU(), nn.Dropout(p=0.5), nn.Dense(16, 3)])
    pipe = engine(model, seed=seed, **config)
    x = ms.Tensor(np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32))
    if rejected_first:
        with pytest.raises(ValueError, match="train_step got 2 inputs"):
            pipe.train_step(x[:2], ms.Tensor(np.array([0, 1], np.int32)))
    for _ in range(3):
        pipe.train_step(x, ms.Tensor(np.array([0, 1, 2, 1], np.int32)))
    return [p.asnumpy() for p in pipe.layout.params]


def test_dropout_masks_repeat_and_do_not_depend_on_micro_batches():
    """Masks come from (seed, step, layer, sample): a second run is bitwise the same, and
    4 micro-batches (or 2 with recompute) train the model 1 does. (Layouts: the CNN below;
    one graph: tests/test_transparency.py.)"""
    whole = trained_with_dropout(micro_batches=1)
    assert all(np.array_equal(a, b) for a, b in zip(trained_with_dropout(micro_batches=1), whole))
    for config in (dict(micro_batches=4), dict(micro_batches=2, recompute=True)):
        for got, want in zip(trained_with_dropout(**config), whole):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(config))
    rejected = trained_with_dropout(rejected_first=True, micro_batches=1)   # not a step
    assert all(np.array_equal(a, b) for a, b in zip(rejected, whole))
    other_seed = trained_with_dropout(seed=1, micro_batches=1)
    assert max(np.abs(a - b).max() for a, b in zip(other_seed, whole)) > 1e-3   # masks matter


def test_a_resumed_run_continues_statistics_and_masks(tmp_path):
    """Batch norm's moving statistics are saved and resumed with the weights, and the step
    count with them (dropout masks depend on it): 2 steps + save + resume + 2 steps end
    where 4 steps do."""
    def build():
        ms.set_seed(8)
        return nn.SequentialCell([nn.Dense(6, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                  nn.Dropout(p=0.5), nn.Dense(8, 3)])
    x = ms.Tensor(np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32))
    y = ms.Tensor(np.array([0, 1, 2, 1], np.int32))
    def steps(pipe, n):
        for _ in range(n):
            pipe.train_step(x, y)
        return pipe
    whole, first = steps(engine(build(), micro_batches=2), 4), steps(engine(build(), micro_batches=2), 2)
    first.save(str(tmp_path), 2)
    resumed = engine(build(), micro_batches=2)
    resumed.resume(str(tmp_path))
    steps(resumed, 2)
    assert [b.name for b in resumed.layout.buffers] == ["1.moving_mean", "1.moving_variance"]
    for got, want in zip(resumed.layout.params + resumed.layout.buffers, whole.layout.params + whole.layout.buffers):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6, atol=1e-7, err_msg=got.name)


def frozen_model():
    """An MLP whose first layer is frozen (requires_grad off), as when fine-tuning."""
    ms.set_seed(9)
    model = nn.SequentialCell([nn.Dense(6, 8), nn.Tanh(), nn.Dense(8, 8), nn.ReLU(), nn.Dense(8, 3)])
    for p in model[0].get_parameters():
        p.requires_grad = False
    return model


@pytest.mark.parametrize("one_graph", [False, True])
def test_frozen_weights_stay_and_the_rest_train_as_one_process(one_graph):
    """A parameter MindSpore does not train is kept as batch norm's statistics are (pipe
    cannot tell them apart): unchanged, while the others train as TrainOneStepCell does."""
    pipe, want = beside_one_process(frozen_model, lambda ps: nn.Adam(ps, 0.01), 8,
                                    micro_batches=4, one_graph=one_graph)
    for name, got in pipe.parameters_dict().items():
        np.testing.assert_allclose(got.asnumpy(), want[name], rtol=1e-5, atol=1e-7, err_msg=name)
    assert [b.name for b in pipe.layout.buffers] == ["0.weight", "0.bias"]
    start = {p.name: p.asnumpy() for p in frozen_model().get_parameters()}
    assert all(np.array_equal(want[n], start[n]) for n in ("0.weight", "0.bias"))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_dtype_mismatch_is_named_as_one_before_mindspore_compiles(dtype, capfd):
    """Found before the forward runs: no failed compile prints its pages first."""
    model = nn.SequentialCell([nn.Dense(8, 4), nn.ReLU(), nn.Dense(4, 3)])
    with pytest.raises(RuntimeError) as err:
        engine(model, micro_batches=2).train_step(np.ones((4, 8), dtype), np.zeros(4, np.int32))
    name = {np.float16: "Float16", np.float64: "Float64"}[dtype]
    assert str(err.value) == ("check before the first step failed: dtype mismatch: stage 0 receives "
                              f"the input batch as {name}, but the first weights it meets are "
                              "Float32; cast the input batch to Float32")
    assert "Call Stack" not in capfd.readouterr().err


def test_a_virtual_stage_is_named_as_one():
    """ZB-V on one stage runs two slices of the layers there: the one that cannot take the
    other's output is named a virtual stage, not a stage."""
    model = nn.SequentialCell([nn.Dense(8, 4), nn.ReLU(), nn.Dense(5, 3)])
    with pytest.raises(RuntimeError) as err:
        engine(model, micro_batches=2, schedule="zb-v").train_step(np.ones((4, 8), np.float32),
                                                                   np.zeros(4, np.int32))
    assert str(err.value) == (
        "check before the first step failed: virtual stage 1 cannot take virtual stage 0's output "
        "(the boundary between layers 1 and 2), of shape (2, 4) Float32; its first layer expects 5 "
        "features. Fix the model so that layer 1's output fits layer 2's input")


def test_half_precision_compute_is_precision_fp16():
    """A model cast with `to_float` is refused under precision='fp32' (its loss gradient
    would underflow unscaled), and trains under 'fp16', which casts every layer itself."""
    def half():
        return nn.SequentialCell([nn.Dense(8, 4).to_float(ms.float16), nn.ReLU(),
                                  nn.Dense(4, 3).to_float(ms.float16)])
    with pytest.raises(TypeError) as err:
        engine(half(), micro_batches=2)
    assert str(err.value) == (
        "layer 0 (Dense) computes in float16 (Cell.to_float), and precision='fp32' would pass "
        "its gradients unscaled, where they underflow; drop the to_float and set "
        "precision='fp16' (pipe casts every layer and scales the loss)")
    loss = engine(half(), micro_batches=2, precision="fp16").train_step(
        np.ones((4, 8), np.float32), np.zeros(4, np.int32))
    assert np.isfinite(loss)


class RawWeight(nn.Cell):
    """x @ w with a Parameter its construct reads itself, not cast to x's dtype."""

    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.eye(4, dtype=np.float32)), name="w")

    def construct(self, x):
        return ops.matmul(x, self.w)


def test_a_parameter_read_raw_in_float16_is_told_how_to_cast():
    model = nn.SequentialCell([nn.Dense(4, 4), RawWeight(), nn.Dense(4, 3)])
    with pytest.raises(RuntimeError) as err:
        engine(model, precision="fp16").train_step(np.ones((4, 4), np.float32), np.zeros(4, np.int32))
    assert "compiling its forward failed (each layer ran alone): TypeError: For primitive" in str(err.value)
    assert HALF_HINT in str(err.value)


def test_bfloat16_is_refused_by_the_cpu_wire_up_front():
    carried = DeadlineWire(5.0).dtypes
    assert unwired(((2, 4), ms.bfloat16), carried) == 0
    assert unwired(((2, 4), ms.float32), carried) is None


RANDOM = ("draws random numbers inside: two runs of its forward on the same input differ, and "
          "pipe's backward runs it again, drawing others; make each dropout an nn.Dropout layer "
          "of its own (pipe draws its mask once per micro-batch)")


@pytest.mark.parametrize("layer,message,one_graph", [
    (NoisyBlock(), "layer 1 (NoisyBlock) " + RANDOM, False),
    (HiddenDropout(4), "layer 1 (HiddenDropout) " + RANDOM, False),
    (GraphOnly(), "compiling its forward failed (each layer ran alone): ", False),
    (GraphOnly(), "compiling its forward failed (each layer ran alone): ", True),
])
def test_what_the_model_does_wrong_is_told_before_the_first_step(layer, message, one_graph):
    """A layer drawing its own random numbers is found by running its forward twice, not by
    its name; an error the model raises only when compiled is told as such, with
    MindSpore's report, which lands outside the working directory: with the step as one
    graph too (the check compiles the forward, though the step's graph compiles its own)."""
    model = nn.SequentialCell([nn.Dense(4, 4), layer, nn.Dense(4, 3)])
    with pytest.raises(RuntimeError) as err:
        engine(model, one_graph=one_graph).train_step(np.ones((4, 4), np.float32), np.zeros(4, np.int32))
    assert str(err.value).startswith("check before the first step failed: stage 0 (layers 0 to 2) "
                                     "failed on the input batch, of shape (4, 4) Float32: " + message)
    assert not os.path.exists(os.path.join(os.getcwd(), "rank_0"))


AVERAGED = ("; return the mean over the rows (reduction='mean'), or (sum, count) for a token "
            "mean: pipe averages the micro-batches' losses, which is one process's only for a mean")


@pytest.mark.parametrize("loss_fn,message", [
    (nn.SoftmaxCrossEntropyWithLogits(sparse=True),        # (reduction='none': one per row)
     "loss_fn gives a loss of shape (2,), not one number" + AVERAGED),
    (nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum"),
     "loss_fn gives 3.25425 on 3 rows, where their own losses' mean is 1.08475: not their mean "
     "(a sum, or a mean over the targets it counts?)" + AVERAGED),
    (nn.CrossEntropyLoss(weight=ms.Tensor([1.0, 2.0, 3.0])),  # (rows weighed by their class)
     "loss_fn gives 0.962817 on 3 rows, where their own losses' mean is 1.08475: not their mean "
     "(a sum, or a mean over the targets it counts?)" + AVERAGED),
])
def test_a_loss_pipe_cannot_average_as_one_process_is_refused(loss_fn, message):
    """A loss per row, summed over the rows, or a mean that weighs rows unequally (over the
    targets it counts): pipe's mean of the micro-batches' losses would train another model
    than one process (the gradients M times smaller for a sum). Found on random logits."""
    model = nn.SequentialCell([nn.Dense(4, 4), nn.Dense(4, 3)])
    engine = PipelineEngine(model, loss_fn, lambda ps: nn.SGD(ps, 0.1),
                            loop_config(batch_size=4, micro_batches=2))
    with pytest.raises(RuntimeError) as err:
        engine.train_step(np.ones((4, 4), np.float32), np.array([0, 2, 1, 0], np.int32))
    assert str(err.value).splitlines()[0] == (
        "check before the first step failed: stage 0 (layers 0 to 1) failed on the input batch, "
        "of shape (2, 4) Float32: " + message)


class WithAux(nn.Cell):
    """(logits, an auxiliary value per row): a tuple as the model's output."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 3)

    def construct(self, x):
        logits = self.dense(x)
        return logits, (logits ** 2).mean(axis=1)


def test_a_tuple_as_the_model_s_output_is_refused_before_a_compile():
    """The last chunk's backward starts from d loss / d logits, one tensor: a tuple failed
    in MindSpore's compile (a Stack of the tuple's gradients)."""
    model = nn.SequentialCell([nn.Dense(4, 4), WithAux()])
    with pytest.raises(RuntimeError) as err:
        engine(model, micro_batches=2).train_step(np.ones((4, 4), np.float32), np.zeros(4, np.int32))
    assert str(err.value).splitlines()[0] == (
        "check before the first step failed: stage 0 (layers 0 to 1) failed on the input batch, "
        "of shape (2, 4) Float32: loss_fn, given logits of a tuple of 2 (shape (2, 3) Float32, "
        "shape (2,) Float32) and labels of shape (2,) Int32, raised Refused: the model's output "
        "must be one tensor, the logits: return them alone from its last layer")


class Tokens(nn.Cell):
    """(B, T, V) -> (B x T, V): logits per token, the labels (B, T) flattened by the loss."""

    def construct(self, x):
        return x.reshape(-1, x.shape[-1])


class TokenMean(nn.Cell):
    """Cross entropy over the tokens: labels (B, T) flattened to the logits' rows."""

    def construct(self, logits, labels):
        return LOSS(logits, labels.reshape(-1))


def test_a_mean_over_tokens_a_model_flattens_passes_the_check_and_trains_as_one_process():
    """The check takes a label row's logits rows with it (here T of them)."""
    def build():
        ms.set_seed(4)
        return nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 5), Tokens()])
    x = ms.Tensor(np.random.default_rng(5).standard_normal((4, 3, 4)).astype(np.float32))
    y = ms.Tensor((np.arange(12) % 5).reshape(4, 3).astype(np.int32))
    whole = build()
    step = nn.TrainOneStepCell(nn.WithLossCell(whole, TokenMean()),
                               nn.SGD(whole.trainable_params(), 0.5))
    pipe = PipelineEngine(build(), TokenMean(), lambda ps: nn.SGD(ps, 0.5),
                          loop_config(batch_size=4, micro_batches=2))
    for _ in range(2):
        step(x, y)
        pipe.train_step(x, y)
    for got, want in zip(pipe.layout.params, whole.trainable_params()):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-7)


class Float32Logits(nn.Cell):
    """A loss that takes float32 logits only, as MindSpore's GPU cross entropy kernels do."""

    def construct(self, logits, labels):
        if logits.dtype != ms.float32:
            raise TypeError(f"float32 logits only, got {logits.dtype}")
        return LOSS(logits, labels)


def test_in_fp16_the_check_gives_the_loss_the_float32_logits_the_step_gives_it():
    """pipe casts the logits to float32 for the loss; the check before the first step, which
    runs each piece eagerly, must too (on GPUs it refused the MNIST example in fp16)."""
    model = nn.SequentialCell([nn.Dense(4, 4), nn.Dense(4, 3)])
    pipe = PipelineEngine(model, Float32Logits(), lambda ps: nn.SGD(ps, 0.1),
                          loop_config(batch_size=4, precision="fp16"))
    assert np.isfinite(pipe.train_step(np.ones((4, 4), np.float32), np.zeros(4, np.int32)))


def test_predict_before_the_first_train_step_needs_no_labels():
    """predict checks the stages in eval mode without the loss (which here wants labels
    shaped like the logits); the first train_step then checks the loss with real labels."""
    def build():
        ms.set_seed(3)
        return nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)])
    mse = nn.MSELoss()
    x, y = np.ones((4, 4), np.float32), np.zeros((4, 2), np.float32)
    first = PipelineEngine(build(), mse, lambda ps: nn.SGD(ps, 0.1), loop_config(batch_size=4))
    before = first.predict(x)
    np.testing.assert_allclose(before, build()(ms.Tensor(x)).asnumpy(), rtol=1e-6)
    plain = PipelineEngine(build(), mse, lambda ps: nn.SGD(ps, 0.1), loop_config(batch_size=4))
    assert first.train_step(x, y) == plain.train_step(x, y)


class CountsCorrect(nn.Cell):
    """(summed cross-entropy, the number of targets the logits get right): a count that
    depends on the logits, which pipe cannot know before the backward."""

    def __init__(self):
        super().__init__()
        self.cross_entropy = nn.CrossEntropyLoss(reduction="sum")

    def construct(self, logits, labels):
        return self.cross_entropy(logits, labels), (logits.argmax(-1) == labels).sum().astype(ms.float32)


def test_a_count_that_depends_on_the_logits_is_refused_before_the_first_step():
    model = nn.SequentialCell([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3)])
    pipe = PipelineEngine(model, CountsCorrect(), lambda ps: nn.SGD(ps, learning_rate=0.1),
                          loop_config(batch_size=4, micro_batches=2))
    with pytest.raises(RuntimeError, match=r"loss_fn returns \(sum, count\) and its count changes "
                                           r"with the logits \(\d+ for zero logits, \d+ for others\): "
                                           r"pipe counts on the labels, before the first backward; "
                                           r"make the count theirs alone"):
        pipe.train_step(np.ones((4, 6), np.float32), np.array([0, 1, 2, 1], np.int32))


NOTHING_COUNTED = (r"^loss_fn counts 0 targets in this step's whole batch: its token mean "
                   r"\(sum / count\) is undefined; leave such batches out")


@pytest.mark.parametrize("mode", [{}, {"one_graph": True, "precision": "fp16"}, {"one_graph": True}],
                         ids=["loop", "one graph fp16", "one graph fp32"])
def test_a_batch_with_nothing_to_count_is_refused_at_its_step(mode):
    """One process's sum / count would be 0 / 0: every rank raises at once (the count is
    the same on every rank, from the labels), after the step's actions that counted it and
    before the update: the weights (and fp16's S) stay as they were."""
    from mlp_run import TokenLoss
    model = nn.SequentialCell([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3)])
    pipe = PipelineEngine(model, TokenLoss(), lambda ps: nn.SGD(ps, learning_rate=0.1),
                          loop_config(batch_size=4, micro_batches=2, **mode))
    x = np.ones((4, 6), np.float32)
    pipe.train_step(x, np.array([0, 1, -1, 2], np.int32))
    before, scale = [p.asnumpy() for p in pipe.layout.params], pipe.scaler and pipe.scaler.value
    with pytest.raises(ValueError, match=NOTHING_COUNTED + "$"):
        pipe.train_step(x, np.full(4, -1, np.int32))
    after = [p.asnumpy() for p in pipe.layout.params]
    assert all(np.array_equal(a, b) for a, b in zip(after, before))
    assert (pipe.scaler and pipe.scaler.value) == scale


def test_clipping_equals_clip_by_global_norm():
    """One process: pipe's clip (2 micro-batches) against MindSpore's own recipe."""
    def build():
        ms.set_seed(6)
        return nn.SequentialCell([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3)])
    x = ms.Tensor(np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32))
    y = ms.Tensor(np.array([0, 1, 2, 1], np.int32))
    pipe = engine(build(), micro_batches=2, clip_grad_norm=0.05)
    pipe.train_step(x, y)
    model = build()
    grads = ms.value_and_grad(lambda x, y: LOSS(model(x), y), None, model.trainable_params())(x, y)[1]
    assert float(ops.sqrt(sum((g * g).sum() for g in grads)).asnumpy()) > 0.05   # it clips
    nn.SGD(model.trainable_params(), learning_rate=0.1)(ops.clip_by_global_norm(grads, 0.05))
    for got, want in zip(pipe.layout.params, model.trainable_params()):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-7)


CNN = ["--model", "cnn", "--data", "synthetic", "--batch-size", "16", "--steps", "2", "--seed", "2",
       "--optimizer", "sgd", "--lr", "0.05", "--no-eval"]


def matrix(root):
    """The CNN's trainings (in the one launch the matrices share: conftest.trained)."""
    def run(name, ranks, *flags):
        return ranks, CNN + list(flags) + ["--save", root / f"cnn-{name}"]
    return [
        run("single-m2", 1, "--micro-batches", 2),
        run("single-m4", 1, "--micro-batches", 4),
        run("clip-single", 1, "--micro-batches", 4, "--clip-grad-norm", 0.05),
        run("1f1b-2x1", 2, "--micro-batches", 2, "--stages", 2),
        run("1f1b-2x1-one-graph", 2, "--micro-batches", 2, "--stages", 2, "--one-graph"),
        run("zb-h1-3x1", 3, "--micro-batches", 2, "--stages", 3, "--schedule", "zb-h1"),
        run("clip-2x2", 4, "--micro-batches", 2, "--stages", 2, "--data-parallel", 2, "--clip-grad-norm", 0.05),
        run("own-single-m2", 1, "--micro-batches", 2, "--build", "own"),
        run("own-zb-v-2x1", 2, "--micro-batches", 2, "--stages", 2, "--schedule", "zb-v", "--build", "own"),
    ]


@pytest.fixture(scope="module")
def cnn(trained):
    names = [str(flags[-1]).split("cnn-", 1)[1] for _, flags in matrix(trained)]
    return {name: (load(trained / f"cnn-{name}" / "model.ckpt"), results(trained / f"cnn-{name}"))
            for name in names}


def assert_same(got, want, names):
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("layout", ["1f1b-2x1", "zb-h1-3x1"])
def test_cnn_trains_like_one_process_with_its_statistics(cnn, layout):
    (got, _), (want, _) = cnn[layout], cnn["single-m2"]
    assert sorted(got) == sorted(want) and any("moving_mean" in name for name in want)
    assert_same(got, want, want)                    # weights and moving statistics


def test_cnn_as_one_graph_is_bitwise_the_loop(cnn):
    """Batch norm, dropout and a skip connection on 2 ranks: the step's graph runs the
    loop's handlers (pipe.actions), buffers put back inside it: the same bits."""
    (graph, _), (loop, _) = cnn["1f1b-2x1-one-graph"], cnn["1f1b-2x1"]
    assert sorted(graph) == sorted(loop) and any("moving_mean" in name for name in loop)
    assert all((graph[name] == loop[name]).all() for name in loop)


def test_cnn_built_layer_by_layer_trains_like_one_process(cnn):
    """`--build own`: each rank builds only its layers (pipe.features.builders), here under ZB-V's V
    (rank 1 holds layers of both chunks); one process builds them all the same way."""
    (got, _), (want, _) = cnn["own-zb-v-2x1"], cnn["own-single-m2"]
    assert sorted(got) == sorted(want) and any("moving_mean" in name for name in want)
    assert_same(got, want, want)
    whole, _ = cnn["single-m2"]                     # built whole: other initial weights
    assert max(np.abs(whole[n] - want[n]).max() for n in want if "weight" in n) > 1e-3


def test_cnn_replicas_share_their_statistics(cnn):
    """Replicas average their moving statistics after every step (documented choice): the
    2x2 run's (clipped, like one process: the next test) are equal across its replicas."""
    _, ranks = cnn["clip-2x2"]
    assert ranks[0]["buffers"] == ranks[2]["buffers"] and ranks[1]["buffers"] == ranks[3]["buffers"]
    assert ranks[0]["buffers"]


def test_cnn_clipping_across_stages_and_replicas(cnn):
    (got, _), (want, _), (unclipped, _) = cnn["clip-2x2"], cnn["clip-single"], cnn["single-m4"]
    names = [name for name in want if "moving" not in name]
    assert_same(got, want, names)
    assert max(np.abs(want[n] - unclipped[n]).max() for n in names) > 1e-4     # clipping acted
