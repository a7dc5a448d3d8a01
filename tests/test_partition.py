"""Splitting a SequentialCell into stages, and the rank grid."""
import pytest
from mindspore import nn

from pipe.partition import balance, partition, stage_bounds
from pipe.topology import Topology


def mlp(widths):
    return nn.SequentialCell([nn.Dense(a, b) for a, b in zip(widths, widths[1:])])


def test_uniform_gives_extra_layers_to_the_first_stages():
    assert stage_bounds(mlp([4] * 8), 3) == [(0, 3), (3, 5), (5, 7)]


def test_parameters_balances_a_wide_first_layer():
    model = mlp([1000, 10, 10, 10, 10])      # 10010, 110, 110, 110 parameters
    assert stage_bounds(model, 2, "parameters") == [(0, 1), (1, 4)]


def test_explicit_sizes():
    assert stage_bounds(mlp([4] * 6), 2, [1, 4]) == [(0, 1), (1, 5)]
    with pytest.raises(ValueError, match=r"explicit partition \[2, 2\] must have 2 positive sizes "
                                         r"summing to the model's 5 layers"):
        stage_bounds(mlp([4] * 6), 2, [2, 2])


def test_measured_costs_balance_the_slowest_stage():
    model = mlp([4] * 7)
    assert stage_bounds(model, 2, (5.0, 1.0, 1.0, 1.0, 1.0, 1.0)) == [(0, 1), (1, 6)]
    with pytest.raises(ValueError, match="2 layer costs given for a model of 6 layers"):
        stage_bounds(model, 2, (1.0, 1.0))


def test_profiling_takes_each_layers_median_time():
    """The clock is scripted, so the check does not depend on the machine's load: layer 0
    'takes' about 100x longer, with one outlier per layer that the median ignores."""
    import mindspore as ms
    import numpy as np

    from pipe.partition import profile_layers
    durations = [[3.0, 2.9, 3.2, 3.1, 90.0], [0.03, 0.02, 9.0, 0.04, 0.03], [0.01, 0.02, 0.02, 0.03, 5.0]]
    readings = []
    for layer in durations:
        for seconds in layer:
            readings += [len(readings), len(readings) + seconds]   # start, end of one repeat
    model = mlp([16, 8, 8, 8])
    costs = profile_layers(model, ms.Tensor(np.ones((4, 16), np.float32)), clock=iter(readings).__next__)
    assert costs == pytest.approx([3.1, 0.03, 0.02])
    assert stage_bounds(model, 2, tuple(costs)) == [(0, 1), (1, 3)]


def test_more_stages_than_layers():
    with pytest.raises(ValueError, match=r"cannot split 3 layers into stages=4: every stage needs "
                                         r"at least one layer; use stages=3 or fewer"):
        stage_bounds(mlp([4] * 4), 4)


def test_balance_minimises_the_slowest_stage():
    assert balance([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert balance([1, 1, 1, 1], 4) == [1, 1, 1, 1]
    assert balance([3, 3, 2, 2, 2], 2) == [2, 3]


def test_stage_keeps_whole_model_parameter_names():
    model = nn.SequentialCell([nn.SequentialCell([nn.Dense(4, 4), nn.ReLU()]), nn.Dense(4, 2)])
    layers, names = partition(model, (1, 2))
    assert names == ["1.weight", "1.bias"]
    assert partition(model, (0, 1))[1] == ["0.0.weight", "0.0.bias"]


def test_topology_grid():
    topo = Topology(stages=2, data_parallel=3)
    assert [(topo.stage_of(r), topo.replica_of(r)) for r in range(6)] == \
        [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert topo.pipeline_ranks(1) == (2, 3)
    assert topo.data_parallel_ranks(1) == (1, 3, 5)
    with pytest.raises(ValueError, match=r"the launcher started 4 processes but stages=2 x "
                                         r"data_parallel=3 = 6: launch with -n 6"):
        topo.check_world_size(4)

