"""pipe.layout: what one rank runs, named as in the whole model (in process, no MPI)."""
import pytest
from mindspore import nn

from pipe.config import PipelineConfig
from pipe.layout import assemble, build_layout
from pipe.modes import Modes


def layout_of(model, config, rank):
    return assemble(config, build_layout(model, nn.MSELoss(), config, rank, "uniform"),
                    Modes(one_graph=False, defer_wgrad=False))


def test_a_rank_holds_its_chunks_under_whole_model_names():
    model = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 4), nn.ReLU(),
                               nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 4), nn.Dense(4, 2)])
    config = PipelineConfig(stages=2, micro_batches=4, batch_size=4, schedule="interleaved-1f1b")
    layout = layout_of(model, config, 1)
    assert (layout.stage, layout.replica, layout.schedule.name) == (1, 0, "interleaved-1f1b")
    assert layout.all_bounds == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert layout.bounds == [(2, 4), (6, 8)] and layout.virtual_stages_held == [1, 3]
    assert layout.names == [["2.weight", "2.bias"], ["6.weight", "6.bias", "7.weight", "7.bias"]]
    assert [p.name for p in layout.params] == ["2.weight", "2.bias", "6.weight", "6.bias",
                                               "7.weight", "7.bias"]
    assert layout.chunks[1].is_last and not layout.chunks[0].is_last and layout.tied == {}
    assert layout.describe() == {"stages": 2, "data_parallel": 1, "schedule": "interleaved-1f1b",
                                 "chunks_per_stage": 2, "bounds": [[0, 2], [2, 4], [4, 6], [6, 8]]}


def test_the_second_replica_runs_the_same_stage_on_other_rows():
    model = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 2)])
    config = PipelineConfig(stages=3, data_parallel=2, micro_batches=2, batch_size=4)
    layout = layout_of(model, config, 4)
    assert (layout.stage, layout.replica, layout.virtual_stages_held) == (1, 1, [1])
    assert layout.topo.data_parallel_ranks(layout.stage) == (1, 4)


def test_more_virtual_stages_than_layers_is_refused_naming_stages_and_chunks():
    model = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 2)])
    config = PipelineConfig(stages=2, micro_batches=2, batch_size=2, schedule="zb-v")
    with pytest.raises(ValueError) as err:
        build_layout(model, nn.MSELoss(), config, 0, "uniform")
    assert str(err.value) == ("cannot split 3 layers into stages=2 x chunks_per_stage=2 = 4 virtual stages: "
                              "every one needs at least one layer; use fewer stages or chunks_per_stage, or "
                              "a deeper model")


def test_deferred_weight_gradients_refuse_batch_norm():
    """W* runs a layer once over all micro-batches' rows: batch norm's gradient would see
    the statistics of them all, not each micro-batch's. A wrong result is refused."""
    model = nn.SequentialCell([nn.Dense(4, 4), nn.BatchNorm1d(4), nn.Dense(4, 2)])
    config = PipelineConfig(micro_batches=2, batch_size=4, defer_wgrad=True)
    with pytest.raises(ValueError) as err:
        build_layout(model, nn.MSELoss(), config, 0, "uniform")
    assert str(err.value) == (
        "defer_wgrad runs each layer's weight gradient once over the rows of all micro-batches, "
        "which batch norm would normalize by the statistics of them all, not of each "
        "micro-batch; '1.moving_mean' is a parameter not trained, which pipe treats as batch "
        "norm's statistics (it cannot tell a frozen weight from them); turn defer_wgrad off")
