"""Schedules as data: literal step x stage tables, and the invariants every schedule keeps."""
from dataclasses import replace

import pytest

from launch import load_example
from pipe.ops.simulator import format_table, simulate
from pipe.schedule import lower, message_key
from pipe.schedules import (CHUNKS_PER_STAGE, EVERY, SCHEDULES, action_costs, defers_wgrad,
                            make_schedule, peak_in_flight, splits_backward)

GPIPE_4x8 = """\
step stage0 stage1 stage2 stage3
0    F0     .      .      .
1    F1     F0     .      .
2    F2     F1     F0     .
3    F3     F2     F1     F0
4    F4     F3     F2     F1
5    F5     F4     F3     F2
6    F6     F5     F4     F3
7    F7     F6     F5     F4
8    .      F7     F6     F5
9    .      .      F7     F6
10   .      .      .      F7
11   .      .      .      B0
12   .      .      B0     B1
13   .      B0     B1     B2
14   B0     B1     B2     B3
15   B1     B2     B3     B4
16   B2     B3     B4     B5
17   B3     B4     B5     B6
18   B4     B5     B6     B7
19   B5     B6     B7     .
20   B6     B7     .      .
21   B7     .      .      ."""

ONE_F_ONE_B_4x8 = """\
step stage0 stage1 stage2 stage3
0    F0     .      .      .
1    F1     F0     .      .
2    F2     F1     F0     .
3    F3     F2     F1     F0
4    .      .      .      B0
5    .      .      B0     F1
6    .      B0     F2     B1
7    B0     F3     B1     F2
8    F4     B1     F3     B2
9    B1     F4     B2     F3
10   F5     B2     F4     B3
11   B2     F5     B3     F4
12   F6     B3     F5     B4
13   B3     F6     B4     F5
14   F7     B4     F6     B5
15   B4     F7     B5     F6
16   .      B5     F7     B6
17   B5     .      B6     F7
18   .      B6     .      B7
19   B6     .      B7     .
20   .      B7     .      .
21   B7     .      .      ."""


INTERLEAVED_2x4_V2 = """\
step stage0 stage1
0    F0     .
1    F1     F0
2    F0:1   F1
3    F1:1   F0:1
4    F2     B0:1
5    B0:1   F1:1
6    F3     B1:1
7    B1:1   F2
8    F2:1   B0
9    B0     F3
10   F3:1   B1
11   B1     F2:1
12   .      B2:1
13   B2:1   F3:1
14   .      B3:1
15   B3:1   B2
16   B2     B3
17   B3     ."""

ZB_H1_3x6 = """\
step stage0 stage1 stage2
0    F0     .      .
1    F1     F0     .
2    F2     F1     F0
3    .      .      I0
4    .      I0     F1
5    I0     F2     I1
6    W0     I1     F2
7    F3     W0     I2
8    I1     F3     W0
9    W1     I2     F3
10   F4     W1     I3
11   I2     F4     W1
12   W2     I3     F4
13   F5     W2     I4
14   I3     F5     W2
15   W3     I4     F5
16   I4     W3     I5
17   W4     I5     W3
18   I5     W4     W4
19   W5     W5     W5"""

ZB_V_2x4 = """\
step stage0 stage1
0    F0     .
1    F1     F0
2    F2     F0:1
3    F0:1   F1
4    I0:1   F1:1
5    W0:1   I0:1
6    F1:1   W0:1
7    I1:1   F2
8    W1:1   I0
9    F3     W0
10   I0     F2:1
11   W0     I1:1
12   F2:1   W1:1
13   I2:1   F3
14   W2:1   I1
15   I1     W1
16   W1     F3:1
17   F3:1   I2:1
18   I3:1   W2:1
19   W3:1   I2
20   I2     I3:1
21   W2     I3
22   I3     W2
23   W3     W3:1
24   .      W3"""

DUALPIPE_V_2x4 = """\
step stage0 stage1
0    F0     .
1    F1     F0
2    F2     F0:1
3    F0:1   F1
4    I0:1   F1:1
5    W0:1   F2
6    F1:1   I0:1
7    F3     W0:1
8    I1:1   F2:1
9    W1:1   I0
10   F2:1   W0
11   I0     F3
12   W0     I1:1
13   I2:1   W1:1
14   W2:1   F3:1
15   F3:1   I1
16   I1     W1
17   W1     I2:1
18   I3:1   W2:1
19   W3:1   I2
20   I2     W2
21   W2     I3:1
22   .      I3
23   I3     W3:1
24   W3     W3"""


def test_gpipe_table():
    assert format_table(lower(SCHEDULES["gpipe"](4, 8))) == GPIPE_4x8


def test_1f1b_table():
    assert format_table(lower(SCHEDULES["1f1b"](4, 8))) == ONE_F_ONE_B_4x8



def test_interleaved_1f1b_table():
    """Chunk c of rank r is virtual stage c*P + r; the order is Megatron's and torch's."""
    assert format_table(lower(make_schedule("interleaved-1f1b", 2, 4, 2))) == INTERLEAVED_2x4_V2


def test_zb_h1_table():
    """B (input gradient) on 1F1B's path; rank r's W lags its B by r micro-batches."""
    assert format_table(lower(make_schedule("zb-h1", 3, 6))) == ZB_H1_3x6

def test_zb_v_table():
    """A V: rank 0 holds virtual stages 0 and 3, rank 1 stages 1 and 2 (no message between)."""
    assert format_table(lower(make_schedule("zb-v", 2, 4, 2))) == ZB_V_2x4


def test_a_v_holds_both_middle_virtual_stages_on_its_last_stage():
    """ZB-V on 2 ranks: rank 0 holds virtual stages 0 and 3, rank 1 the middle two, which
    hand over on the rank; a virtual stage past either end is held by none."""
    zbv = make_schedule("zb-v", 2, 4, 2)
    assert [[vs for vs in range(-1, 5) if zbv.holds(rank, vs)] for rank in (0, 1)] == [[0, 3], [1, 2]]


def test_dualpipe_v_table():
    """ZB-V's placement; the main phase pairs F on one chunk with B W on the other."""
    assert format_table(lower(make_schedule("dualpipe-v", 2, 4, 2))) == DUALPIPE_V_2x4


def test_dualpipe_v_phases_on_stage_0():
    """DeepSeek's eight phases for P=3, M=6, rank 0: nF0, nF0F1, nB1W1F1, the main phase
    (F0 with B1 W1, F1 with B0 W0), nB1F1B0, nB1B0 (W waiting from the middle pair on),
    nWB0, nW."""
    order = " ".join(str(a) for a in make_schedule("dualpipe-v", 3, 6, 2).actions[0])
    assert order == ("F0 F1 F2 F3 " "F4 F0:1 " "I0:1 W0:1 F1:1 I1:1 W1:1 F2:1 "
                     "F5 I2:1 W2:1 F3:1 I0 W0 " "I3:1 W3:1 F4:1 I1 W1 I4:1 W4:1 F5:1 I2 W2 "
                     "I5:1 W5:1 I3 " "W3 I4 W4 I5 " "W5")


def test_v_shape_places_chunk_1_on_the_way_back():
    schedule = make_schedule("zb-v", 3, 6, 2)
    assert [[schedule.virtual_stage(r, c) for c in (0, 1)] for r in range(3)] == [[0, 5], [1, 4], [2, 3]]
    assert [schedule.stage_of(vs) for vs in range(6)] == [0, 1, 2, 2, 1, 0]


def test_1f1b_phases_on_first_stage():
    """Warm-up P-1 forwards, steady alternation, cool-down backwards."""
    order = " ".join(str(a) for a in SCHEDULES["1f1b"](4, 8).actions[0])
    assert order == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"


def test_lowered_messages_of_two_stage_1f1b():
    actions = lower(SCHEDULES["1f1b"](2, 3)).actions
    assert [str(a) for a in actions[0]] == "F0 sF0 F1 sF1 rB0 B0 F2 sF2 rB1 B1 rB2 B2".split()
    assert [str(a) for a in actions[1]] == "rF0 F0 B0 rF1 sB0 F1 B1 rF2 sB1 F2 B2 sB2".split()


def build(name, stages, micro_batches, chunks=2):
    return lower(make_schedule(name, stages, micro_batches,
                               chunks if name == "interleaved-1f1b" else CHUNKS_PER_STAGE.get(name, 1)))


def compute(schedule, rank):
    return [a for a in schedule.actions[rank] if a.is_compute]


def message_pairs(schedule):
    sends, recvs = [], []
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if not a.is_compute:
                key = message_key(schedule, rank, a)
                if a.kind[0] == "s":
                    sends.append((rank, a.peer, key))
                else:
                    recvs.append((a.peer, rank, key))
    return sends, recvs


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("stages,micro_batches", [(1, 1), (2, 2), (3, 3), (4, 8), (3, 6), (5, 15), (2, 8)])
def test_schedule_invariants(name, stages, micro_batches):
    if name == "interleaved-1f1b" and stages == 1:
        with pytest.raises(ValueError, match="interleaved 1F1B needs at least 2 stages"):
            build(name, stages, micro_batches)
        return
    if name == "dualpipe-v" and micro_batches < 2 * stages:
        with pytest.raises(ValueError, match=f"got micro_batches={micro_batches}: use "
                                             f"micro_batches={2 * stages}, or schedule='zb-v'$"):
            build(name, stages, micro_batches)
        return
    schedule = build(name, stages, micro_batches)
    kinds = "FIW" if splits_backward(schedule) else "FB"
    for rank, actions in enumerate(schedule.actions):
        compute = [(a.kind, a.mb, a.chunk) for a in actions if a.is_compute]
        # every micro-batch's F and B (or I and W) exactly once per model chunk, in that order
        expected = [(k, m, c) for k in kinds for m in range(micro_batches)
                    for c in range(schedule.chunks_per_stage)]
        assert sorted(compute) == sorted(expected)
        for m in range(micro_batches):
            for c in range(schedule.chunks_per_stage):
                places = [compute.index((k, m, c)) for k in kinds]
                assert places == sorted(places)
        peak = peak_in_flight(schedule, rank)          # held from F until the last of B, W
        if name == "gpipe":
            assert peak == micro_batches
        elif name == "1f1b":
            assert peak == min(stages - rank, micro_batches)
        elif name == "zb-h1":                             # 1F1B's peak, on every rank
            assert peak == stages and peak_in_flight(schedule, rank, through="B") == stages - rank
        elif name == "zb-v":                              # 2P chunks of half a stage
            assert peak <= 2 * stages
        elif name == "dualpipe-v":                        # one more: DualPipe's PP+1
            assert peak == 2 * stages + 1
    sends, recvs = message_pairs(schedule)
    assert sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends)
    v_turns = schedule.chunks_per_stage == 2 and name != "interleaved-1f1b"   # a V turns on one stage
    crossings = schedule.virtual_stages - 1 - v_turns
    assert len(sends) == 2 * crossings * micro_batches
    simulate(schedule)                      # blocking semantics: raises if it could hang


ONE_F_ONE_B_2x4_DEFERRED_WGRAD = """\
step stage0 stage1
0    F0     .
1    F1     F0
2    .      I0
3    I0     F1
4    F2     I1
5    I1     F2
6    F3     I2
7    I2     F3
8    .      I3
9    I3     W*
10   W*     W*
11   W*     W*
12   W*     W*
13   W*     ."""


def test_deferred_wgrad_table():
    """1F1B with W deferred to the flush (the docstring's timeline): B passes the gradient
    on, one W* per rank takes M ticks at the end."""
    schedule = lower(make_schedule("1f1b", 2, 4, defer_wgrad=True))
    assert format_table(schedule) == ONE_F_ONE_B_2x4_DEFERRED_WGRAD


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("stages,micro_batches", [(1, 2), (2, 4), (3, 6), (4, 8)])
def test_deferred_wgrad_keeps_f_and_b_and_ends_each_chunk_with_one_w(name, stages, micro_batches):
    """The schedule's F and B in their order and its messages, no W until each chunk's one
    W* at the end, after its last B; every micro-batch is held until then (M per chunk)."""
    if name == "interleaved-1f1b" and stages == 1:
        return
    plain = build(name, stages, micro_batches)
    schedule = lower(make_schedule(name, stages, micro_batches, plain.chunks_per_stage, defer_wgrad=True))
    assert splits_backward(schedule) and defers_wgrad(schedule)
    for rank in range(stages):
        actions = compute(schedule, rank)
        assert [a for a in actions if a.kind != "W"] == [replace(a, kind="I") if a.kind == "B" else a
                                                         for a in compute(plain, rank) if a.kind != "W"]
        flush = actions[-plain.chunks_per_stage:]
        assert [a.kind for a in flush] == ["W"] * plain.chunks_per_stage and all(a.mb == EVERY for a in flush)
        assert sorted(a.chunk for a in flush) == list(range(plain.chunks_per_stage))
        assert peak_in_flight(schedule, rank) == plain.chunks_per_stage * micro_batches
    assert sorted(message_pairs(schedule)[0]) == sorted(message_pairs(plain)[0])
    simulate(schedule)


def test_zb_h1_holds_1f1b_peak_memory_until_w():
    """A waiting W keeps its micro-batch's layer inputs: counted until W, every rank holds
    at most P micro-batches, 1F1B's peak (Qi et al., Table 2); P=8: 8, not 15."""
    for stages in (4, 8):
        schedule = build("zb-h1", stages, 4 * stages)
        assert [peak_in_flight(schedule, r) for r in range(stages)] == [stages] * stages


def test_interleaved_with_m_equal_p_warms_up_like_megatron_today():
    """M = P: warm-up 2(P-r-1) + (v-1)P forwards, not all vM: later ranks hold less, with
    the bubble of the all-warm-up order."""
    schedule = build("interleaved-1f1b", 4, 4, 2)
    forwards_first = [next(i for i, a in enumerate(compute(schedule, r)) if a.kind == "B")
                      for r in range(4)]              # warm-up, then the steady state's first F
    assert forwards_first == [8, 8, 6 + 1, 4 + 1]     # all vM = 8 on every rank before
    assert [peak_in_flight(schedule, r) for r in range(4)] == [8, 8, 7, 5]
    assert bubble("interleaved-1f1b", 4, 4) == pytest.approx(3 / (2 * 4 + 3))


def bubble(name, stages, micro_batches, chunks=2):
    schedule = build(name, stages, micro_batches, chunks)
    return simulate(schedule, action_costs(schedule), eager_sends=True).bubble


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 8), (4, 16), (8, 32), (3, 3)])
def test_bubble_matches_closed_form(name, stages, micro_batches):
    """GPipe and 1F1B idle (p-1)/(m+p-1) of the time, whatever F and B cost."""
    assert bubble(name, stages, micro_batches) == pytest.approx((stages - 1) / (micro_batches + stages - 1))


@pytest.mark.parametrize("stages,micro_batches,chunks", [(2, 4, 2), (4, 8, 2), (4, 16, 2), (2, 8, 4), (3, 6, 2)])
def test_interleaved_bubble_is_one_vth(stages, micro_batches, chunks):
    """Megatron's closed form: (p-1)/(v m + p - 1), about 1/v of 1F1B's."""
    got = bubble("interleaved-1f1b", stages, micro_batches, chunks)
    assert got == pytest.approx((stages - 1) / (chunks * micro_batches + stages - 1))


@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 8), (4, 16), (8, 32), (3, 6), (5, 7)])
@pytest.mark.parametrize("costs", [(1, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1.5, 0.5)])
def test_zb_h1_bubble_is_the_papers(stages, micro_batches, costs):
    """Each rank idles (P-1)(F + B - W) (Qi et al.), against 1F1B's (P-1)(F + B + W)."""
    f, b, w = costs
    schedule = build("zb-h1", stages, micro_batches)
    makespan = simulate(schedule, action_costs(schedule, f, b, w), eager_sends=True).makespan
    assert makespan - micro_batches * (f + b + w) == pytest.approx((stages - 1) * (f + b - w))


COMPARED = """\
P=2 M=4, costs F=1 I=1 W=1
schedule                  bubble  messages  peak memory per stage (micro-batches)
gpipe                     0.2000         8  4 4
1f1b                      0.2000         8  2 1
interleaved-1f1b (v=2)    0.1111        24  2.5 1.5
zb-h1                     0.0769         8  2 2
zb-v                      0.0400        16  2 2
dualpipe-v                0.0400        16  2.5 2.5
"""

COMPARED_DEFERRED_WGRAD = """\
P=2 M=4, costs F=1 I=1 W=1, W* at the flush
schedule                  bubble  messages  peak memory per stage (micro-batches)
gpipe                     0.1429         8  4 4
1f1b                      0.1429         8  4 4
interleaved-1f1b (v=2)    0.0769        24  4 4
zb-h1                     0.1429         8  4 4
zb-v                      0.0769        16  4 4
dualpipe-v                0.0769        16  4 4
"""


@pytest.mark.parametrize("flags,table", [([], COMPARED), (["--defer-wgrad"], COMPARED_DEFERRED_WGRAD)])
def test_cli_compares_every_schedule(capsys, flags, table):
    """Deferred, W* costs M x W and every micro-batch waits for it: the bubble the flush
    adds and the memory it holds."""
    main = load_example("show_schedule", "show_schedule.py").main
    main(["--schedule", "all", "--stages", "2", "--micro-batches", "4"] + flags)
    assert capsys.readouterr().out == table


@pytest.mark.parametrize("stages,micro_batches", [(2, 3), (2, 8), (3, 6), (4, 7), (4, 16), (8, 32)])
@pytest.mark.parametrize("cost", [1, 0.5, 3])
def test_zb_v_idles_half_of_zb_h1(stages, micro_batches, cost):
    """With M >= 2P-1 and F = B = W (each one chunk's, half a stage's) a rank idles
    (P-1) F: half of ZB-H1's (P-1)(F + B - W) over whole stages."""
    schedule = build("zb-v", stages, micro_batches)
    timeline = simulate(schedule, action_costs(schedule, cost, cost, cost), eager_sends=True)
    assert timeline.makespan - 2 * micro_batches * 3 * cost == pytest.approx((stages - 1) * cost)


@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (3, 6), (4, 9), (4, 16), (8, 16)])
@pytest.mark.parametrize("costs", [(1, 1, 1), (0.5, 0.5, 0.5), (1, 2, 1), (2, 2, 1), (1, 1.5, 0.5)])
def test_dualpipe_v_bubble(stages, micro_batches, costs):
    """With F = B = W a rank idles (P-1) F, as in ZB-V; with any costs, never more than
    DualPipe's published (P-1)(F&B + B - 3W) for a pair run one after the other
    (F&B = F + B + W, its B the whole backward B + W)."""
    f, b, w = costs
    schedule = build("dualpipe-v", stages, micro_batches)
    timeline = simulate(schedule, action_costs(schedule, f, b, w), eager_sends=True)
    idle = timeline.makespan - 2 * micro_batches * (f + b + w)
    if f == b == w:
        assert idle == pytest.approx((stages - 1) * f)
    assert idle <= (stages - 1) * ((f + b + w) + (b + w) - 3 * w) + 1e-9


def test_cli_prints_table_bubble_and_messages(capsys):
    main = load_example("show_schedule", "show_schedule.py").main
    main(["--schedule", "zb-h1", "--stages", "2", "--micro-batches", "4"])
    out = capsys.readouterr().out
    assert out.startswith("step stage0 stage1\n0    F0     .\n1    F1     F0\n2    .      I0\n")
    assert "bubble: 0.0769" in out
    assert "stage 0 sends: sF0->1 sF1->1 sF2->1 sF3->1" in out
    assert "stage 1 receives: rF0<-0 rF1<-0 rF2<-0 rF3<-0" in out


@pytest.mark.parametrize("argv,message", [
    (["--stages", "0"], "error: --stages 0 must be a positive integer\n"),
    (["--schedule", "interleaved-1f1b", "--stages", "2", "--micro-batches", "3"],
     "error: interleaved 1F1B needs the micro-batches (3) to be a multiple of the stages (2): "
     "use --micro-batches 4\n"),
])
def test_cli_answers_a_bad_value_with_one_line_and_exit_code_2(capsys, argv, message):
    main = load_example("show_schedule", "show_schedule.py").main
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err == message


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_lowering_stamps_what_the_wire_needs(name):
    """Each send and its receive carry the same tag and boundary; tags differ between
    messages, and the handshake's free tag is none of them."""
    schedule = build(name, 3, 6)
    stamps = {}
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if not a.is_compute:
                key = message_key(schedule, rank, a)
                stamps.setdefault(key, set()).add((a.tag, a.boundary))
    assert all(len(stamp) == 1 for stamp in stamps.values())
    tags = [tag for stamp in stamps.values() for tag, _ in stamp]
    assert len(set(tags)) == len(tags) and 0 <= min(tags) and max(tags) < schedule.free_tag
    for (kind, _, receiving), stamp in stamps.items():     # F goes into `receiving`, B out of the next
        assert {b for _, b in stamp} == {receiving if kind == "F" else receiving + 1}
