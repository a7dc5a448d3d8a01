"""pipe.batch.split: which rows of the global batch each replica's micro-batches get (and
pipe.features.dropout.draws: which masks they draw; pipe.ops.predict: how predict cuts its batch)."""
import numpy as np
import pytest

from pipe.batch import split
from pipe.config import PipelineConfig
from pipe.features.dropout import draws
from pipe.ops.predict import split_for_predict


def test_replica_r_takes_its_contiguous_rows_in_m_pieces():
    config = PipelineConfig(data_parallel=2, micro_batches=3, batch_size=12, seed=5)
    inputs, labels = np.arange(24, dtype=np.float32).reshape(12, 2), np.arange(12, dtype=np.int32)
    batch = split(config, inputs, labels, replica=1)
    assert [b.asnumpy().tolist() for b in batch.labels] == [[6, 7], [8, 9], [10, 11]]
    assert batch.inputs[2].asnumpy().tolist() == [[20, 21], [22, 23]]
    assert [d.rows for d in draws(config, batch, 4)] == [slice(6, 8), slice(8, 10), slice(10, 12)]
    assert {(d.seed, d.step, d.batch_size) for d in draws(config, batch, 4)} == {(5, 4, 12)}


def test_a_batch_of_another_size_is_refused_naming_the_config_field():
    config = PipelineConfig(micro_batches=2, batch_size=8)
    with pytest.raises(ValueError, match=r"^train_step got 6 inputs and 6 labels; "
                                         r"batch_size=8 is configured$"):
        split(config, np.zeros((6, 2)), np.zeros(6), replica=0)


def test_predict_cuts_the_whole_batch_and_refuses_a_remainder():
    config = PipelineConfig(data_parallel=2, micro_batches=2, batch_size=8)
    batch = split_for_predict(config, np.arange(6, dtype=np.float32).reshape(6, 1))
    assert [b.asnumpy().ravel().tolist() for b in batch.inputs] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match=r"^5 inputs do not divide into micro_batches=2: "
                                         r"pass predict or evaluate a multiple of 2 rows$"):
        split_for_predict(config, np.zeros((5, 1)))
