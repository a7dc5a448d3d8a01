"""The simulator replays blocking messages and names the stages of a deadlock; a recorded
trace's costs and bubble (benchmarks/trace_bubble.py)."""
import json
import os
import sys
from dataclasses import replace

import pytest

from pipe.ops.simulator import Deadlock, checked_schedule, simulate
from pipe.schedule import Action, Schedule, lower
from pipe.schedules import SCHEDULES, make_schedule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import trace_bubble  # noqa: E402


def test_receive_without_send_is_a_deadlock():
    broken = Schedule("broken", 2, 1, [[Action("F", 0)], [Action("rF", 0, peer=0), Action("F", 0)]])
    with pytest.raises(Deadlock) as err:
        simulate(broken)
    assert err.value.waiting == {1: Action("rF", 0, peer=0)}
    assert "stage 1 waits at step 0: rF0 (peer stage 0)" in str(err.value)


def test_both_neighbours_sending_first_is_a_deadlock():
    """The classic blocking-send cycle: each rank sends before it receives."""
    rank0 = [Action("F", 1), Action("sF", 1, peer=1), Action("rB", 0, peer=1), Action("B", 0)]
    rank1 = [Action("B", 0), Action("sB", 0, peer=0), Action("rF", 1, peer=0), Action("F", 1)]
    with pytest.raises(Deadlock) as err:
        simulate(Schedule("cycle", 2, 2, [rank0, rank1]))
    assert sorted(err.value.waiting) == [0, 1]
    assert "stage 0 waits at step 1: sF1 (peer stage 1)" in str(err.value)
    assert "stage 1 waits at step 1: sB0 (peer stage 0)" in str(err.value)


def test_messages_out_of_order_are_refused():
    """NCCL delivers in order per pair: a receive of micro-batch 1 would get micro-batch 0."""
    rank0 = [Action("F", 0), Action("F", 1), Action("sF", 0, peer=1), Action("sF", 1, peer=1)]
    rank1 = [Action("rF", 1, peer=0), Action("rF", 0, peer=0), Action("F", 0), Action("F", 1)]
    with pytest.raises(Deadlock, match="exchange different messages"):
        simulate(Schedule("swapped", 2, 2, [rank0, rank1]), eager_sends=True)
    with pytest.raises(Deadlock, match="exchange different messages"):
        simulate(Schedule("swapped", 2, 2, [rank0, rank1]))


def test_lowering_an_impossible_compute_order_fails():
    """Stage 1 wants micro-batch 1 first, stage 0 sends 0 first and waits for its gradient."""
    impossible = Schedule("impossible", 2, 2, [
        [Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)],
        [Action("F", 1), Action("B", 1), Action("F", 0), Action("B", 0)]])
    with pytest.raises(ValueError, match="can never complete"):
        lower(impossible)


def test_unknown_schedule_name():
    with pytest.raises(ValueError, match=r"unknown schedule 'pipedream': choose one of gpipe, 1f1b, "
                                         r"interleaved-1f1b, zb-h1, zb-v, dualpipe-v$"):
        checked_schedule("pipedream", 2, 4)


def test_a_v_turn_computed_out_of_order_is_refused():
    """The last rank of a V hands micro-batch 0 from virtual stage 1 to 2 itself: running
    stage 2's forward first can never get its input."""
    good = make_schedule("zb-v", 2, 3, 2)
    swapped = [Action("F", 0, 1), Action("F", 0, 0)] + [a for a in good.actions[1]
                                                         if (a.kind, a.mb) != ("F", 0)]
    broken = replace(good, actions=[good.actions[0], swapped])
    with pytest.raises(Deadlock, match=r"stage 1 runs F0:1 before the F of micro-batch 0 on "
                                       r"virtual stage 1, on the same stage, whose output it needs"):
        simulate(lower(broken))


def test_costs_set_the_clock():
    """P=2, M=2, B twice as costly as F: stage 0 waits for each gradient from rank 1."""
    timeline = simulate(lower(SCHEDULES["1f1b"](2, 2)), costs={"F": 1, "B": 2})
    spans = [[(start, end, str(a)) for start, end, a in rank] for rank in timeline.spans]
    assert spans[0] == [(0, 1, "F0"), (1, 2, "F1"), (4, 6, "B0"), (7, 9, "B1")]
    assert spans[1] == [(1, 2, "F0"), (2, 4, "B0"), (4, 5, "F1"), (5, 7, "B1")]
    assert timeline.makespan == 9


def span(name, rank, start, dur):
    """One action of a Chrome trace, times in microseconds."""
    return {"name": name, "ph": "X", "pid": rank, "tid": 0, "ts": start, "dur": dur}


def traced(folder, events):
    """(the trace file of `events`, trace_bubble's spans of it)."""
    trace = folder / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    return trace, trace_bubble.compute_spans(trace)


def test_a_recorded_trace_gives_costs_and_its_own_bubble(tmp_path, capsys):
    """Medians of F, I, W (messages are not compute); the bubble is the stage-time between
    the first and the last compute that none ran: here 2 stages x 11 ms, 12 ms of it busy."""
    trace, spans = traced(tmp_path, [
        span("F0", 0, 0, 2000), span("sF0", 0, 2000, 500), span("I0", 0, 8000, 2000),
        span("F0", 1, 3000, 2000), span("I0", 1, 5000, 2000), span("W0", 1, 7000, 4000)])
    assert trace_bubble.measured_costs(spans) == (2.0, 2.0, 4.0)
    assert trace_bubble.measured_bubble(spans) == pytest.approx(1 - 12000 / (2 * 11000))
    trace_bubble.main([str(trace), "--schedule", "zb-h1", "--stages", "2", "--micro-batches", "1"])
    assert capsys.readouterr().out == ("costs (ms): F=2 I=2 W=4\n"
                                       "bubble: 0.3333 simulated, 0.4545 in the trace\n")


def test_a_deferred_w_in_a_trace_counts_for_every_micro_batch(tmp_path):
    """`W*` ran once for the 2 micro-batches it found forwarded: 6 ms is 3 ms of W each;
    it is compute in the bubble too (2 stages x 14 ms, 22 ms of it busy)."""
    _, spans = traced(tmp_path, [
        span("F0", 0, 0, 2000), span("F1", 0, 2000, 2000), span("I0", 0, 6000, 1000),
        span("I1", 0, 7000, 1000), span("W*", 0, 8000, 6000),
        span("F0", 1, 2000, 2000), span("F1", 1, 4000, 2000), span("W*", 1, 8000, 6000)])
    assert trace_bubble.measured_costs(spans) == (2.0, 1.0, 3.0)
    assert trace_bubble.measured_bubble(spans) == pytest.approx(1 - 22000 / (2 * 14000))


@pytest.mark.parametrize("text", ["{}", "not json", '{"traceEvents": []}', '{"traceEvents": [1]}'])
def test_a_file_with_no_recorded_step_is_refused_by_name(tmp_path, text):
    trace = tmp_path / "trace.json"
    trace.write_text(text)
    with pytest.raises(ValueError) as err:
        trace_bubble.main([str(trace)])
    assert str(err.value) == (f"{trace} holds no F, B, I or W span of a Chrome trace: give one "
                              "that `benchmarks/benchmark.py --trace STEM` recorded")
