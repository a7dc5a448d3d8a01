"""pipe.layout: what one rank holds, named as in the whole model (in process, no MPI)."""
from mindspore import nn

from pipe.config import PipelineConfig
from pipe.layout import build_layout
from pipe.schedule import make_schedule
from pipe.topology import Topology


def test_a_rank_holds_its_chunks_under_whole_model_names():
    model = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 4), nn.ReLU(),
                               nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 4), nn.Dense(4, 2)])
    config = PipelineConfig(stages=2, micro_batches=4, batch_size=4, schedule="interleaved-1f1b")
    schedule = make_schedule(config.schedule, 2, 4, config.virtual_stages)
    layout = build_layout(model, nn.MSELoss(), config, schedule, Topology(2, 1), 1, "uniform")
    assert layout.all_bounds == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert layout.bounds == [(2, 4), (6, 8)]                   # virtual stages 1 and 3
    assert layout.names == [["2.weight", "2.bias"], ["6.weight", "6.bias", "7.weight", "7.bias"]]
    assert [p.name for p in layout.params] == ["2.weight", "2.bias", "6.weight", "6.bias",
                                               "7.weight", "7.bias"]
    assert layout.chunks[1].is_last and not layout.chunks[0].is_last and layout.tied == {}
