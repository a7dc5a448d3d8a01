"""Mixed precision (pipe.features.precision): a pipelined float16 run equals one process running the
same recipe, MindSpore's own `to_float` and DynamicLossScaleUpdateCell, step by step.

Every layer computes in float16 on float32 weights; the loss is float32, its gradient
scaled by S. The runs start at S = 2**14, which no clean step overflows. In the overflow
runs step 3's whole batch makes the first layer's weight gradient overflow in one
process's float16 product while each micro-batch's and each replica's fits
(mlp_run.batches): every mode, the loop and one graph, W deferred or per micro-batch, on
1x1, 2x1, 2x2 and ZB-V 2x2, must skip that step on every rank and halve S as the single
process does (one stage as one graph: test_step.py, bitwise this loop). The
tolerances are float16's: whole-batch and micro-batch products round
differently, 1e-3 of a weight's change.
"""
import mindspore as ms
import numpy as np
import pytest
from launch import assert_same_bits, load, loop_config, results
from mindspore import nn
from mlp_run import LOSS, batches, build_model, plain_fp16_run

from pipe.engine import PipelineEngine
from pipe.features.precision import Unscale
from pipe.ops.checkpoint import latest

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
SEED, SCALE = 7, 2.0 ** 14
CASES = {"1f1b-2x1": dict(schedule="1f1b", stages=2),
         "overflow-1x1": dict(schedule="1f1b", stages=1),
         "overflow-1f1b-2x1": dict(schedule="1f1b", stages=2),
         "overflow-one-graph-1f1b-2x1": dict(schedule="1f1b", stages=2, one_graph=True),
         "overflow-one-graph-defer-wgrad-1f1b-2x2": dict(schedule="1f1b", stages=2, data_parallel=2,
                                                         one_graph=True, defer_wgrad=True),
         "overflow-zb-v-defer-wgrad-2x2": dict(schedule="zb-v", stages=2, data_parallel=2,
                                               defer_wgrad=True)}
OVERFLOWS = [name for name in CASES if name.startswith("overflow")]


def matrix(root):
    """The float16 runs (trained in the suite's one launch: conftest.trained)."""
    return [(c.get("stages", 1) * c.get("data_parallel", 1),
             {"config": {"micro_batches": 4, "precision": "fp16", "loss_scale": SCALE, **c},
              "optimizer": "sgd", "seed": SEED, "save": str(root / f"fp16-{name}"),
              "overflow": 2 if name.startswith("overflow") else None})
            for name, c in CASES.items()]


@pytest.fixture(scope="module")
def plain():
    return {"clean": plain_fp16_run(SEED, SCALE), "overflow": plain_fp16_run(SEED, SCALE, 2)}


def assert_same_run(trained, name, want):
    weights, losses, scales = want
    got = load(trained / f"fp16-{name}" / "model.ckpt")
    assert sorted(got) == sorted(weights)
    for key in weights:
        np.testing.assert_allclose(got[key], weights[key], rtol=0, atol=2e-4, err_msg=key)
    for rank, result in results(trained / f"fp16-{name}").items():
        np.testing.assert_allclose(result["losses"], losses, rtol=2e-3, err_msg=f"rank {rank}")
        assert result["loss_scales"] == scales, f"rank {rank}"


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith(("overflow", "one-graph"))])
def test_fp16_pipeline_equals_one_process(trained, plain, name):
    assert_same_run(trained, name, plain["clean"])


@pytest.mark.parametrize("name", OVERFLOWS)
def test_a_step_whose_whole_batch_overflows_is_skipped_in_every_mode(trained, plain, name):
    """Steps 1-2 as one process's; step 3's weights stay as they were on every rank
    (stage 1's gradients fit: it skips on stage 0's flag), S halves, training goes on as
    one process's."""
    assert plain["overflow"][2] == [SCALE, SCALE, SCALE / 2, SCALE / 2]
    assert_same_run(trained, name, plain["overflow"])


def test_one_graph_in_float16_is_bitwise_the_per_action_loop(trained):
    """The loss scale goes into the step's graph as an input, the skipped step too: not one
    bit moves."""
    got = load(trained / "fp16-overflow-one-graph-1f1b-2x1" / "model.ckpt")
    want = load(trained / "fp16-overflow-1f1b-2x1" / "model.ckpt")
    assert_same_bits(got, want)


def test_activations_cross_the_stages_in_float16_and_gradients_sum_in_float32(trained):
    for name in (n for n, c in CASES.items() if c["stages"] > 1):
        for rank, result in results(trained / f"fp16-{name}").items():
            assert result["wire_dtypes"] == ["Float16"], (name, rank)
            assert result["grad_dtypes"] == ["Float32"], (name, rank)


def test_the_loss_scale_is_saved_with_the_checkpoint(trained):
    _, meta = latest(str(trained / "fp16-overflow-zb-v-defer-wgrad-2x2"))
    assert (meta["loss_scale"], meta["loss_scale_clean_steps"]) == (SCALE / 2, 1)


def test_a_resumed_run_goes_on_with_the_saved_loss_scale(tmp_path):
    """With a window of 1 the scale doubles every clean step: 2 steps, save, resume into
    a fresh engine, 1 step: the scale the uninterrupted 3 steps reach."""
    def engine():
        config = loop_config(batch_size=16, micro_batches=2, precision="fp16", loss_scale=8.0,
                                loss_scale_window=1)
        return PipelineEngine(build_model(SEED), LOSS, lambda ps: nn.SGD(ps, 0.1), config)
    data = batches(SEED, steps=3)
    first = engine()
    for x, y in data[:2]:
        first.train_step(x, y)
    first.save(str(tmp_path), 2)
    resumed = engine()
    resumed.resume(str(tmp_path))
    assert resumed.scaler.value == first.scaler.value == 32.0
    resumed.train_step(*data[2])
    assert resumed.scaler.value == 64.0


@pytest.mark.parametrize("bad,where,flag", [
    (None, 0, 0.0), (np.inf, 1, 1.0), (-np.inf, 1, 1.0), (np.nan, 1, 1.0),
    (65519.0, 0, 0.0), (-65520.0, 0, 1.0), (1e6, 1, 0.0)])
def test_the_overflow_flag_is_an_inf_a_nan_or_a_float16_gradient_beyond_float16(bad, where, flag):
    """Unscale at S = 2: an inf or a nan anywhere raises the flag, and so does a float16
    product's gradient (the first) whose scaled value float16 rounds to inf (65520 and
    above); a float32 gradient (the second) may hold any finite value."""
    grads = [np.ones((3, 4), np.float32), np.full(5, 2.0, np.float32)]
    if bad is not None:
        grads[where].reshape(-1)[3] = bad
    unscaled, overflow = Unscale(half=(True, False))(
        ms.mutable(tuple(ms.Tensor(g) for g in grads)), ms.Tensor(0.5, ms.float32))
    assert overflow.asnumpy().tolist() == [flag]
    if bad is None:
        np.testing.assert_array_equal(unscaled[1].asnumpy(), np.ones(5, np.float32))
