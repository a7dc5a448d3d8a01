"""Pipeline inference returns the single-process forward: on every rank with result
broadcast, on the last stage only without it (tests/predict_check.py, in the suite's one
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
