"""Every named schedule: GPipe and 1F1B (pipe.schedule), interleaved, zero bubble and V shapes.

A schedule that splits the backward runs I (the input gradient, which the previous stage
waits for) and W (the weight gradient, which nobody waits for) where others run B;
`with_deferred_wgrad` moves every W to the flush (`W*`). `examples/show_schedule.py`
prints any of them."""
from dataclasses import dataclass, replace

from pipe.schedule import Action, Schedule, gpipe, one_f_one_b

__all__ = ["VSchedule", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v", "SCHEDULES",
           "CHUNKS_PER_STAGE", "EVERY", "make_schedule", "with_deferred_wgrad", "micro_batches_of",
           "splits_backward", "defers_wgrad", "peak_in_flight", "action_costs"]

EVERY = None         # the micro-batch of a W deferred to the flush: all of the step's


@dataclass
class VSchedule(Schedule):
    """Two chunks per stage in a V (ZB-V, DualPipeV): stage s holds virtual stages s and
    2P-1-s, so the last stage hands the activation between its two chunks itself."""

    def stage_of(self, virtual_stage):
        return virtual_stage if virtual_stage < self.stages else 2 * self.stages - 1 - virtual_stage

    def virtual_stage(self, stage, chunk):
        return 2 * self.stages - 1 - stage if chunk == 1 else stage


def micro_batches_of(schedule, action):
    """The micro-batches `action` works on: all of them for a W deferred to the flush."""
    return tuple(range(schedule.micro_batches)) if action.mb is EVERY else (action.mb,)


def splits_backward(schedule):
    """Whether the backward runs as I and W (input, then weight gradients) instead of B."""
    return any(a.kind == "I" for actions in schedule.actions for a in actions)


def defers_wgrad(schedule):
    """Whether each chunk's W runs once, at the flush, for every micro-batch."""
    return any(a.kind == "W" and a.mb is EVERY for actions in schedule.actions for a in actions)


def interleaved_1f1b(stages, micro_batches, chunks_per_stage=2):
    """Interleaved 1F1B (Narayanan et al., 2021): stage s holds virtual stages s, s+P, ...
    Micro-batches go through the chunks in groups of P; warm-up is 2(P-r-1) + (v-1)P forwards
    (at most all vM, as in Megatron and torch) and the bubble shrinks to about 1/v of 1F1B's.
    P=2, M=4, v=2 (`F0:1` = micro-batch 0, chunk 1):

        stage0: F0 F1 F0:1 F1:1 F2   B0:1 F3   B1:1 F2:1 B0 F3:1 B1 .    B2:1 .    B3:1 B2 B3
        stage1: .  F0 F1   F0:1 B0:1 F1:1 B1:1 F2   B0   F3 B1   F2:1 B2:1 F3:1 B3:1 B2   B3"""
    if stages < 2:
        raise ValueError("interleaved 1F1B needs at least 2 stages: its chunks pass activations "
                         "between stages; use schedule='1f1b' on one stage")
    if micro_batches % stages:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({micro_batches}) to be a "
                         f"multiple of the stages ({stages}): use micro_batches="
                         f"{(micro_batches // stages + 1) * stages}")
    total = micro_batches * chunks_per_stage

    def unit(k, backward):
        """The k-th forward (or backward) of a stage: (micro-batch, chunk)."""
        group, within = divmod(k, stages * chunks_per_stage)
        chunk = within // stages
        if backward:
            chunk = chunks_per_stage - 1 - chunk
        return group * stages + within % stages, chunk

    actions = []
    for stage in range(stages):
        warmup = min(total, 2 * (stages - stage - 1) + (chunks_per_stage - 1) * stages)
        order = [Action("F", *unit(k, False)) for k in range(warmup)]
        for k in range(total - warmup):                         # steady state
            order += [Action("F", *unit(warmup + k, False)), Action("B", *unit(k, True))]
        order += [Action("B", *unit(k, True)) for k in range(total - warmup, total)]  # cool-down
        actions.append(order)
    return Schedule("interleaved-1f1b", stages, micro_batches, actions,
                    chunks_per_stage=chunks_per_stage)


def zb_h1(stages, micro_batches):
    """Zero-bubble ZB-H1 (Qi et al., ICLR 2024): I keeps B's 1F1B place on the critical path
    and W fills time a stage would idle, shrinking the bubble from (P-1)(F + I + W) to
    (P-1)(F + I - W). Stage r lags each W r micro-batches behind its I, holding at most P
    micro-batches, 1F1B's peak. P=3, M=6:

        stage0: F0 F1 F2 .  .  I0 W0 F3 I1 W1 F4 I2 W2 F5 I3 W3 I4 W4 I5 W5
        stage1: .  F0 F1 .  I0 F2 I1 W0 F3 I2 W1 F4 I3 W2 F5 I4 W3 I5 W4 W5
        stage2: .  .  F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 F4 I4 W2 F5 I5 W3 W4 W5"""
    actions = []
    for stage in range(stages):
        warmup, lag = min(stages - stage - 1, micro_batches), stage
        order = [Action("F", m) for m in range(warmup)]
        for i in range(micro_batches):
            if warmup + i < micro_batches:
                order.append(Action("F", warmup + i))
            order.append(Action("I", i))
            if i >= lag:
                order.append(Action("W", i - lag))
        order += [Action("W", m) for m in range(max(0, micro_batches - lag), micro_batches)]
        actions.append(order)
    return Schedule("zb-h1", stages, micro_batches, actions)


def _next_action(done, kind, chunk):
    """The stage's next `kind` action on `chunk`: its micro-batch counts the ones `done`."""
    mb = done.get((kind, chunk), 0)
    done[(kind, chunk)] = mb + 1
    return Action(kind, mb, chunk)


def zb_v(stages, micro_batches):
    """ZB-V (Qi et al., ICLR 2024, section 6): a V of two chunks per stage with I and W split;
    the steady state runs F I W on one chunk, then the other, at 1F1B's peak memory. Stage r:

        warm-up    2(P-r)-1 F on chunk 0; r x (F chunk 1, F chunk 0); P-r x (F I W chunk 1)
        steady     F I W on chunk 0, F I W on chunk 1, until every forward has run
        cool-down  r x (I chunk 0, I chunk 1); P-r x (I W chunk 0); the W still waiting

    With fewer than 2P-1 micro-batches the missing ones' actions are left out (as torch's
    ScheduleZBVZeroBubble). With F = I = W a stage idles (P-1) F: half of ZB-H1's bubble.
    P=2, M=4:

        step    0    1    2    3    4    5    6    7    8    9    10   11   12
        stage0: F0   F1   F2   F0:1 I0:1 W0:1 F1:1 I1:1 W1:1 F3   I0   W0   F2:1
        stage1: .    F0   F0:1 F1   F1:1 I0:1 W0:1 F2   I0   W0   F2:1 I1:1 W1:1
        step    13   14   15   16   17   18   19   20   21   22   23   24
        stage0: I2:1 W2:1 I1   W1   F3:1 I3:1 W3:1 I2   W2   I3   W3   .
        stage1: F3   I1   W1   F3:1 I2:1 W2:1 I2   I3:1 I3   W2   W3:1 W3"""
    padded = max(micro_batches, 2 * stages - 1)
    actions = []
    for stage in range(stages):
        done, order = {}, []

        def run(*units):                 # (kind, chunk): the next micro-batch of each
            order.extend(_next_action(done, kind, chunk) for kind, chunk in units)

        run(*[("F", 0)] * (2 * (stages - stage) - 1))                    # warm-up
        run(*[("F", 1), ("F", 0)] * stage)
        run(*[("F", 1), ("I", 1), ("W", 1)] * (stages - stage))
        while done[("F", 0)] < padded or done[("F", 1)] < done[("F", 0)]:   # steady
            if done[("F", 0)] < padded:
                run(("F", 0))
            run(("I", 0), ("W", 0), ("F", 1), ("I", 1), ("W", 1))
        run(*[("I", 0), ("I", 1)] * stage)                                 # cool-down
        run(*[("I", 0), ("W", 0)] * (stages - stage))
        run(*[("W", 1)] * (padded - done[("W", 1)]), *[("W", 0)] * (padded - done[("W", 0)]))
        actions.append([a for a in order if a.mb < micro_batches])
    return VSchedule("zb-v", stages, micro_batches, actions, chunks_per_stage=2)


def dualpipe_v(stages, micro_batches):
    """DualPipeV (DeepSeek's DualPipe cut in half; dualpipev.py): ZB-V's V, the steady state
    pairing a forward on one chunk with a whole backward (I then W) on the other, run one
    after the other here (DualPipe overlaps a pair's compute with the other's communication).
    Stage r's phases (W: the oldest weight gradient still waiting):

        1 nF0       2(P-r-1) x F chunk 0
        2 nF0F1     r+1 x (F chunk 0, F chunk 1)
        3 nB1W1F1   P-r-1 x (I chunk 1 and its W later, W, F chunk 1)
        4 main      M-2P+r+1 x (F chunk 0 with I W chunk 1, F chunk 1 with I W chunk 0)
        5 nB1F1B0   P-r-1 x (I W chunk 1, F chunk 1 with I W chunk 0)
        6 nB1B0     r+1 x (I chunk 1, I chunk 0), their W waiting from the middle pair on
        7 nWB0      P-r-1 x (W, I chunk 0 and its W later)
        8 nW        the r+1 W still waiting

    It needs M >= 2P and holds 2P+1 chunk micro-batches (DualPipe's "PP+1"). P=2, M=4:

        step    0    1    2    3    4    5    6    7    8    9    10   11   12
        stage0: F0   F1   F2   F0:1 I0:1 W0:1 F1:1 F3   I1:1 W1:1 F2:1 I0   W0
        stage1: .    F0   F0:1 F1   F1:1 F2   I0:1 W0:1 F2:1 I0   W0   F3   I1:1
        step    13   14   15   16   17   18   19   20   21   22   23   24
        stage0: I2:1 W2:1 F3:1 I1   W1   I3:1 W3:1 I2   W2   .    I3   W3
        stage1: W1:1 F3:1 I1   W1   I2:1 W2:1 I2   W2   I3:1 I3   W3:1 W3"""
    if micro_batches < 2 * stages:
        raise ValueError(f"dualpipe-v needs at least 2 x stages = {2 * stages} micro-batches, got "
                         f"micro_batches={micro_batches}: use micro_batches={2 * stages}, or "
                         "schedule='zb-v'")
    P, M = stages, micro_batches
    actions = []
    for r in range(P):
        done, order, waiting = {}, [], []

        def F(chunk):
            order.append(_next_action(done, "F", chunk))

        def B(chunk, w_later=False):
            """The input gradient, then its W at once or (w_later) when W() takes it."""
            backward = _next_action(done, "I", chunk)
            order.append(backward)
            (waiting if w_later else order).append(Action("W", backward.mb, chunk))

        def W():
            order.append(waiting.pop(0))

        for _ in range(2 * (P - r - 1)):                 # 1 nF0
            F(0)
        for _ in range(r + 1):                           # 2 nF0F1
            F(0)
            F(1)
        for _ in range(P - r - 1):                       # 3 nB1W1F1
            B(1, w_later=True)
            W()
            F(1)
        for _ in range(M - 2 * P + r + 1):               # 4 main: nF0B1F1B0
            F(0)
            B(1)
            F(1)
            B(0)
        for _ in range(P - r - 1):                       # 5 nB1F1B0
            B(1)
            F(1)
            B(0)
        middle = (r + 1) // 2
        for i in range(r + 1):                           # 6 nB1B0
            B(1, w_later=i > middle or (i == middle and r % 2 == 1))
            B(0, w_later=i >= middle)
        for _ in range(P - r - 1):                       # 7 nWB0
            W()
            B(0, w_later=True)
        while waiting:                                   # 8 nW
            W()
        actions.append(order)
    return VSchedule("dualpipe-v", stages, micro_batches, actions, chunks_per_stage=2)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved-1f1b": interleaved_1f1b,
             "zb-h1": zb_h1, "zb-v": zb_v, "dualpipe-v": dualpipe_v}
CHUNKS_PER_STAGE = {"interleaved-1f1b": 2, "zb-v": 2, "dualpipe-v": 2}     # (others: 1)


def with_deferred_wgrad(schedule):
    """Deferred weight gradients (Megatron's --defer-embedding-wgrad-compute, for every
    layer): I computes only the input gradient and each chunk's W runs once at the flush, over
    all M micro-batches' rows: one product per layer, the one a single process runs on the
    whole batch. Every micro-batch then holds its layer inputs until the flush, and no W fills
    the bubble. 1F1B, P=2, M=4 (`W*` takes M ticks); the chunk whose last I comes first runs
    its W first:

        stage0: F0 F1 .  I0 F2 I1 F3 I2 .  I3 W* W* W* W*
        stage1: .  F0 I0 F1 I1 F2 I2 F3 I3 W* W* W* W*"""
    actions = []
    for order in schedule.actions:
        kept = [replace(a, kind="I") if a.kind == "B" else a for a in order if a.kind != "W"]
        last_i = {a.chunk: i for i, a in enumerate(kept) if a.kind == "I"}
        actions.append(kept + [Action("W", EVERY, c) for c in sorted(last_i, key=last_i.get)])
    return replace(schedule, actions=actions)


def make_schedule(name, stages, micro_batches, chunks_per_stage=1, defer_wgrad=False):
    """The named schedule's compute actions, its W deferred to the flush when `defer_wgrad`."""
    schedule = _named_schedule(name, stages, micro_batches, chunks_per_stage)
    return with_deferred_wgrad(schedule) if defer_wgrad else schedule


def _named_schedule(name, stages, micro_batches, chunks_per_stage):
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    if name == "interleaved-1f1b":
        return interleaved_1f1b(stages, micro_batches, chunks_per_stage)
    if chunks_per_stage != CHUNKS_PER_STAGE.get(name, 1):
        raise ValueError(f"chunks_per_stage={chunks_per_stage}: schedule={name!r} runs "
                         f"{CHUNKS_PER_STAGE.get(name, 1)} chunk(s) per stage; only "
                         "interleaved-1f1b takes other counts")
    return SCHEDULES[name](stages, micro_batches)


def peak_in_flight(schedule, stage, through="W"):
    """Most micro-batches `stage` holds activations of at once: forwarded and not past their
    last backward piece (W when split); `through="B"` stops counting at B (or I)."""
    release = ("W",) if through == "W" and splits_backward(schedule) else ("B", "I")
    held = peak = 0
    for action in schedule.actions[stage]:
        if action.kind in release:
            held -= len(micro_batches_of(schedule, action))
        held += action.kind == "F"
        peak = max(peak, held)
    return peak


def action_costs(schedule, forward=1.0, backward=1.0, weight=1.0):
    """Durations for the simulator; a schedule that does not split the backward runs B as I + W."""
    return {"F": forward, "B": backward + weight, "I": backward, "W": weight}
