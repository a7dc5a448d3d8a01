"""Pipeline inference returns the single-process forward: on every rank with result
broadcast, on the last stage only without it; evaluation, the single-process loss on every
rank (tests/predict_check.py, in the suite's one
launch: conftest.trained)."""
import pytest
from launch import results

LAYOUTS = [(3, 1), (2, 2)]


def matrix(root):
    return [(p * d, {"model": "predict", "save": str(root / f"predict-{p}x{d}"),
                     "config": {"stages": p, "data_parallel": d}}) for p, d in LAYOUTS]


@pytest.mark.parametrize("stages,data_parallel", LAYOUTS)
def test_predict_matches_single_process(trained, stages, data_parallel):
    ranks = results(trained / f"predict-{stages}x{data_parallel}")
    assert sorted(ranks) == list(range(stages * data_parallel))
    for rank, got in ranks.items():
        last = rank % stages == stages - 1
        assert got["broadcast"] is True, rank
        assert got["own"] is (True if last else None), rank
        assert got["loss"] is True, rank


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_evaluate_gives_one_process_token_mean_and_refuses_other_labels(precision):
    """A (sum, count) loss over labels with padding: one process's sum / count on the whole
    batch (in fp16 its layers compute in float16, as pipe's: to float16's round-off, as
    MindSpore's compiled kernels differ from its eager ones there), weights unchanged."""
    import mindspore as ms
    import numpy as np
    from launch import loop_config
    from mlp_run import TokenLoss, batches, build_model

    from pipe.engine import PipelineEngine
    ms.set_context(mode=ms.PYNATIVE_MODE)
    (x, y), = batches(3, padded=True, steps=1)
    model = build_model(3)
    pipe = PipelineEngine(build_model(3), TokenLoss(), lambda ps: ms.nn.SGD(ps, 0.1),
                          loop_config(micro_batches=4, batch_size=len(x), precision=precision))
    if precision == "fp16":
        for layer in model.cells():
            layer.to_float(ms.float16)
    total, count = TokenLoss()(model(ms.Tensor(x)).astype(ms.float32), ms.Tensor(y))
    rtol = 1e-6 if precision == "fp32" else 1e-3    # (float16 kernels, compiled or not)
    assert np.isclose(pipe.evaluate(x, y), float((total / count).asnumpy()), rtol=rtol)
    assert all(np.array_equal(p.asnumpy(), q.asnumpy())
               for p, q in zip(pipe.layout.params, model.trainable_params()))
    with pytest.raises(ValueError) as err:
        pipe.evaluate(x, y[:-1])
    assert str(err.value) == (f"evaluate got {len(x)} inputs and {len(x) - 1} labels: give one "
                              "row of labels per row of inputs")
