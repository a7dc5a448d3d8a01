"""pipe.ops.trace: what the benchmark reads from a recorded step."""
from pipe.ops.trace import host_costs


def test_host_costs_are_medians_per_action_kind():
    spans = [("F0", 300), ("F1", 100), ("F2", 200), ("sB1:1", 40), ("sB0:1", 60), ("optimizer", 900)]
    events = [{"name": name, "dur": dur} for name, dur in spans]
    assert host_costs(events) == {"F": 200, "sB": 50, "optimizer": 900}
