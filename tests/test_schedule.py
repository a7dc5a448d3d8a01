"""Schedules as data: literal step x rank tables, and the invariants every schedule keeps."""
import pytest

from pipe.schedule import SCHEDULES, lower, message_key, peak_in_flight
from pipe.simulator import format_table, simulate

GPIPE_4x8 = """\
step rank0 rank1 rank2 rank3
0    F0    .     .     .
1    F1    F0    .     .
2    F2    F1    F0    .
3    F3    F2    F1    F0
4    F4    F3    F2    F1
5    F5    F4    F3    F2
6    F6    F5    F4    F3
7    F7    F6    F5    F4
8    .     F7    F6    F5
9    .     .     F7    F6
10   .     .     .     F7
11   .     .     .     B0
12   .     .     B0    B1
13   .     B0    B1    B2
14   B0    B1    B2    B3
15   B1    B2    B3    B4
16   B2    B3    B4    B5
17   B3    B4    B5    B6
18   B4    B5    B6    B7
19   B5    B6    B7    .
20   B6    B7    .     .
21   B7    .     .     ."""

ONE_F_ONE_B_4x8 = """\
step rank0 rank1 rank2 rank3
0    F0    .     .     .
1    F1    F0    .     .
2    F2    F1    F0    .
3    F3    F2    F1    F0
4    .     .     .     B0
5    .     .     B0    F1
6    .     B0    F2    B1
7    B0    F3    B1    F2
8    F4    B1    F3    B2
9    B1    F4    B2    F3
10   F5    B2    F4    B3
11   B2    F5    B3    F4
12   F6    B3    F5    B4
13   B3    F6    B4    F5
14   F7    B4    F6    B5
15   B4    F7    B5    F6
16   .     B5    F7    B6
17   B5    .     B6    F7
18   .     B6    .     B7
19   B6    .     B7    .
20   .     B7    .     .
21   B7    .     .     ."""


def test_gpipe_table():
    assert format_table(lower(SCHEDULES["gpipe"](4, 8))) == GPIPE_4x8


def test_1f1b_table():
    assert format_table(lower(SCHEDULES["1f1b"](4, 8))) == ONE_F_ONE_B_4x8


def test_1f1b_phases_on_first_rank():
    """Warm-up P-1 forwards, steady alternation, cool-down backwards."""
    order = " ".join(str(a) for a in SCHEDULES["1f1b"](4, 8).actions[0])
    assert order == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"


def test_lowered_messages_of_two_stage_1f1b():
    actions = lower(SCHEDULES["1f1b"](2, 3)).actions
    assert [str(a) for a in actions[0]] == "F0 sF0 F1 sF1 rB0 B0 F2 sF2 rB1 B1 rB2 B2".split()
    assert [str(a) for a in actions[1]] == "rF0 F0 B0 rF1 sB0 F1 B1 rF2 sB1 F2 B2 sB2".split()


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("stages,micro_batches", [(1, 1), (2, 2), (3, 4), (4, 8), (4, 3), (5, 16)])
def test_schedule_invariants(name, stages, micro_batches):
    schedule = lower(SCHEDULES[name](stages, micro_batches))
    for rank, actions in enumerate(schedule.actions):
        compute = [(a.kind, a.mb) for a in actions if a.is_compute]
        # every micro-batch's F and B exactly once, F before B
        assert sorted(compute) == sorted([(k, m) for k in "FB" for m in range(micro_batches)])
        for m in range(micro_batches):
            assert compute.index(("F", m)) < compute.index(("B", m))
        peak = peak_in_flight(schedule, rank)
        if name == "gpipe":
            assert peak == micro_batches
        else:
            assert peak == min(stages - rank, micro_batches)
    # every send has exactly one receive carrying the same message, and nothing hangs
    sends, recvs = [], []
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if not a.is_compute:
                entry = (rank, a.peer, message_key(schedule, rank, a)) if a.kind[0] == "s" else \
                        (a.peer, rank, message_key(schedule, rank, a))
                (sends if a.kind[0] == "s" else recvs).append(entry)
    assert sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends)
    assert len(sends) == 2 * (stages - 1) * micro_batches
    simulate(schedule)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_bubble_matches_closed_form(name, stages, micro_batches):
    """With equal F and B costs, both schedules idle (p-1)/(m+p-1) of the time."""
    timeline = simulate(lower(SCHEDULES[name](stages, micro_batches)))
    assert timeline.bubble == pytest.approx((stages - 1) / (micro_batches + stages - 1))
