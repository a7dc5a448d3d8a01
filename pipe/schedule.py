"""Pipeline schedules as data: for every rank, the ordered list of actions it performs.

A compute action is F (forward), B (backward) or W (weight gradient, only in schedules that
split the backward), for one micro-batch on one of the rank's model chunks (a W deferred to
the flush: for all of them, `with_deferred_wgrad`). `lower()` adds
the point-to-point messages; `pipe.simulator` replays the result to check and time it; the
engine only executes it. Printing `format_table()` shows the step x rank grid.
"""
from dataclasses import dataclass, field, replace

__all__ = ["Action", "Schedule", "gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1", "zb_v",
           "dualpipe_v", "SCHEDULES", "CHUNKS", "EVERY", "make_schedule", "with_deferred_wgrad",
           "forward_only", "lower", "message_key", "message_tag", "peak_in_flight"]

COMPUTE = ("F", "B", "W")
EVERY = -1           # the micro-batch of a W deferred to the flush: all of the step's
SEND_F, RECV_F, SEND_B, RECV_B = "sF", "rF", "sB", "rB"


@dataclass(frozen=True)
class Action:
    """One thing a rank does. Prints as `F3` (forward of micro-batch 3), `B3:1` (backward of
    micro-batch 3 on the rank's model chunk 1), `W*` (the weight gradient of every
    micro-batch, deferred to the flush), `sF3` / `rF3` (send / receive the activation
    of micro-batch 3), `sB3` / `rB3` (send / receive its gradient); `peer` is the other rank.
    `lower()` stamps each message with its wire `tag` and the `boundary` it crosses (b: into
    virtual stage b, or back out of it), all the wire needs; they follow from the rest."""

    kind: str
    mb: int
    chunk: int = 0
    peer: int = -1
    tag: int = field(default=-1, compare=False)
    boundary: int = field(default=-1, compare=False)

    def __str__(self):
        mb = "*" if self.mb == EVERY else self.mb
        return f"{self.kind}{mb}" + (f":{self.chunk}" if self.chunk else "")

    @property
    def is_compute(self):
        return self.kind in COMPUTE


@dataclass
class Schedule:
    """Per-rank action lists for P ranks, M micro-batches and v model chunks per rank.

    Rank r's chunk c is virtual stage c*P + r (a loop: with v=1 a rank is simply its
    stage), or with `v_shape` (two chunks) virtual stages r and 2P-1-r: the last rank
    holds the two middle ones and hands the activation from one to the other itself.
    `split_backward` is True when B computes only the input gradient and W the weights';
    `defer_wgrad` when each chunk's W runs once, at the end, for every micro-batch.
    """

    name: str
    stages: int
    micro_batches: int
    actions: list                  # actions[rank] -> [Action, ...]
    chunks: int = 1
    split_backward: bool = False
    v_shape: bool = False
    defer_wgrad: bool = False

    @property
    def virtual_stages(self):
        return self.stages * self.chunks

    def rank_of(self, virtual_stage):
        if self.v_shape and virtual_stage >= self.stages:
            return 2 * self.stages - 1 - virtual_stage
        return virtual_stage % self.stages

    def virtual_stage(self, rank, chunk):
        if self.v_shape and chunk == 1:
            return 2 * self.stages - 1 - rank
        return chunk * self.stages + rank

    def micro_batches_of(self, action):
        """The micro-batches `action` works on: all of them for a W deferred to the flush."""
        return tuple(range(self.micro_batches)) if action.mb == EVERY else (action.mb,)

    def holds(self, rank, virtual_stage):
        """Whether `virtual_stage` exists and runs on `rank`: a neighbour there (the turn of
        ZB-V's and DualPipeV's V) is handed its tensor directly, with no message."""
        return 0 <= virtual_stage < self.virtual_stages and self.rank_of(virtual_stage) == rank

    def chunk_of(self, virtual_stage):
        """Which of its rank's chunks a virtual stage is."""
        return virtual_stage // self.stages

    @property
    def free_tag(self):
        """A tag no message of this schedule uses (the shape handshake's)."""
        return message_tag(("F", self.micro_batches, 0), self.virtual_stages)


def gpipe(stages, micro_batches):
    """All forwards, then all backwards (Huang et al., 2019). P=3, M=4, one tick per action:

        rank0: F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
        rank1: .  F0 F1 F2 F3 .  .  B0 B1 B2 B3
        rank2: .  .  F0 F1 F2 F3 B0 B1 B2 B3

    Simple, but every stage holds the activations of all M micro-batches at once.
    """
    F = [Action("F", m) for m in range(micro_batches)]
    B = [Action("B", m) for m in range(micro_batches)]
    return Schedule("gpipe", stages, micro_batches, [F + B for _ in range(stages)])


def one_f_one_b(stages, micro_batches):
    """1F1B (PipeDream-Flush, Narayanan et al., 2021; MindSpore's pipeline order).

    Stage s runs P-s-1 warm-up forwards, then alternates one forward and one backward in the
    steady state, then drains the remaining backwards in the cool-down:

        rank0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3    warm-up F0 F1 | steady F2 B0 F3 B1 | cool-down B2 B3
        rank1: .  F0 F1 .  B0 F2 B1 F3 B2 .  B3
        rank2: .  .  F0 B0 F1 B1 F2 B2 F3 B3

    Same bubble as GPipe, but stage s never holds more than P-s micro-batches' activations.
    """
    actions = []
    for rank in range(stages):
        warmup = min(stages - rank - 1, micro_batches)
        order = [Action("F", m) for m in range(warmup)]
        for i in range(micro_batches - warmup):                 # steady state
            order += [Action("F", warmup + i), Action("B", i)]
        order += [Action("B", m) for m in range(micro_batches - warmup, micro_batches)]  # cool-down
        actions.append(order)
    return Schedule("1f1b", stages, micro_batches, actions)


def interleaved_1f1b(stages, micro_batches, chunks=2):
    """Interleaved 1F1B (Narayanan et al., 2021): each rank holds `chunks` model chunks that
    are not adjacent (rank r: virtual stages r, r+P, ...). Micro-batches go through the
    chunks in groups of P, so a rank can start chunk 1 of the first micro-batches while the
    later stages still work on chunk 0. Warm-up is longer, 2(P-r-1) + (v-1)P forwards (at
    most all vM, and also when M = P: later ranks then hold less, as in today's Megatron and
    torch); the bubble shrinks to about 1/v of 1F1B's. P=2, M=4, v=2 (`F0:1` = micro-batch
    0, chunk 1):

        rank0: F0 F1 F0:1 F1:1 F2   B0:1 F3   B1:1 F2:1 B0 F3:1 B1 .    B2:1 .    B3:1 B2 B3
        rank1: .  F0 F1   F0:1 B0:1 F1:1 B1:1 F2   B0   F3 B1   F2:1 B2:1 F3:1 B3:1 B2   B3
    """
    if stages < 2:
        raise ValueError("interleaved 1F1B needs at least 2 stages: its chunks pass activations "
                         "between ranks; use schedule='1f1b' on one stage")
    if micro_batches % stages:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({micro_batches}) to be a "
                         f"multiple of the stages ({stages}): use micro_batches="
                         f"{(micro_batches // stages + 1) * stages}")
    total = micro_batches * chunks

    def unit(k, backward):
        """The k-th forward (or backward) of a rank: (micro-batch, chunk)."""
        group, within = divmod(k, stages * chunks)
        chunk = within // stages
        return group * stages + within % stages, (chunks - 1 - chunk) if backward else chunk

    actions = []
    for rank in range(stages):
        warmup = min(total, 2 * (stages - rank - 1) + (chunks - 1) * stages)
        order = [Action("F", *unit(k, False)) for k in range(warmup)]
        for k in range(total - warmup):                         # steady state
            order += [Action("F", *unit(warmup + k, False)), Action("B", *unit(k, True))]
        order += [Action("B", *unit(k, True)) for k in range(total - warmup, total)]  # cool-down
        actions.append(order)
    return Schedule("interleaved-1f1b", stages, micro_batches, actions, chunks=chunks)


def zb_h1(stages, micro_batches):
    """Zero-bubble ZB-H1 (Qi et al., ICLR 2024): the backward splits into B (the input
    gradient, which the previous stage waits for) and W (the weight gradient, which nobody
    waits for). B keeps its 1F1B place on the critical path; W fills time a stage would
    otherwise idle, which shrinks the bubble from 1F1B's (P-1)(F + B + W) to
    (P-1)(F + B - W): about a third of it when F = B = W.

    Rank r runs 1F1B's order (P-r-1 warm-up forwards, then F and B alternating) with each
    W lagging its B by r micro-batches. A micro-batch holds memory until its W, so rank r
    holds at most (P - r) + r = P micro-batches: 1F1B's peak, on every rank. P=3, M=6:

        rank0: F0 F1 F2 .  .  B0 W0 F3 B1 W1 F4 B2 W2 F5 B3 W3 B4 W4 B5 W5
        rank1: .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 F4 B3 W2 F5 B4 W3 B5 W4 W5
        rank2: .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 F4 B4 W2 F5 B5 W3 W4 W5
    """
    actions = []
    for rank in range(stages):
        warmup, lag = min(stages - rank - 1, micro_batches), rank
        order = [Action("F", m) for m in range(warmup)]
        for i in range(micro_batches):
            if warmup + i < micro_batches:
                order.append(Action("F", warmup + i))
            order.append(Action("B", i))
            if i >= lag:
                order.append(Action("W", i - lag))
        order += [Action("W", m) for m in range(max(0, micro_batches - lag), micro_batches)]
        actions.append(order)
    return Schedule("zb-h1", stages, micro_batches, actions, split_backward=True)


def _next_action(done, kind, chunk):
    """The rank's next `kind` action on `chunk`: its micro-batch counts the ones `done`."""
    mb = done.get((kind, chunk), 0)
    done[(kind, chunk)] = mb + 1
    return Action(kind, mb, chunk)


def zb_v(stages, micro_batches):
    """ZB-V (Qi et al., ICLR 2024, section 6): two chunks per rank in a V, rank r holding
    virtual stages r (chunk 0, on the way down) and 2P-1-r (chunk 1, on the way back), so
    rank 0 both starts a micro-batch and computes its loss. With B and W split, the
    steady state runs F B W on one chunk, then on the other, at 1F1B's peak activation
    memory (2P chunks of half a stage each). Rank r's phases:

        warm-up    2(P-r)-1 F on chunk 0; r x (F chunk 1, F chunk 0); P-r x (F B W chunk 1)
        steady     F B W on chunk 0, F B W on chunk 1, until every forward has run
        cool-down  r x (B chunk 0, B chunk 1); P-r x (B W chunk 0); the W still waiting

    The phases assume at least 2P-1 micro-batches; with fewer, the actions of the missing
    ones are left out (the phases of torch's ScheduleZBVZeroBubble). When F = B = W (each
    one chunk's) a rank then idles (P-1) F: half of ZB-H1's bubble for the same model.
    P=2, M=4 (`F0:1` = micro-batch 0 on chunk 1; rank 1 hands micro-batch 0 from its
    chunk 0 to its chunk 1 itself):

        step   0    1    2    3    4    5    6    7    8    9    10   11   12
        rank0: F0   F1   F2   F0:1 B0:1 W0:1 F1:1 B1:1 W1:1 F3   B0   W0   F2:1
        rank1: .    F0   F0:1 F1   F1:1 B0:1 W0:1 F2   B0   W0   F2:1 B1:1 W1:1
        step   13   14   15   16   17   18   19   20   21   22   23   24
        rank0: B2:1 W2:1 B1   W1   F3:1 B3:1 W3:1 B2   W2   B3   W3   .
        rank1: F3   B1   W1   F3:1 B2:1 W2:1 B2   B3:1 B3   W2   W3:1 W3
    """
    padded = max(micro_batches, 2 * stages - 1)
    actions = []
    for rank in range(stages):
        done, order = {}, []

        def run(*units):                 # (kind, chunk): the next micro-batch of each
            order.extend(_next_action(done, kind, chunk) for kind, chunk in units)

        run(*[("F", 0)] * (2 * (stages - rank) - 1))                    # warm-up
        run(*[("F", 1), ("F", 0)] * rank)
        run(*[("F", 1), ("B", 1), ("W", 1)] * (stages - rank))
        while done[("F", 0)] < padded or done[("F", 1)] < done[("F", 0)]:   # steady
            if done[("F", 0)] < padded:
                run(("F", 0))
            run(("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1))
        run(*[("B", 0), ("B", 1)] * rank)                                 # cool-down
        run(*[("B", 0), ("W", 0)] * (stages - rank))
        run(*[("W", 1)] * (padded - done[("W", 1)]), *[("W", 0)] * (padded - done[("W", 0)]))
        actions.append([a for a in order if a.mb < micro_batches])
    return Schedule("zb-v", stages, micro_batches, actions, chunks=2, split_backward=True,
                    v_shape=True)


def dualpipe_v(stages, micro_batches):
    """DualPipeV (DeepSeek-AI's DualPipe cut in half by Sea AI Lab; DeepSeek's dualpipev.py):
    ZB-V's V placement, with the steady state pairing a forward on one chunk with a whole
    backward (B then W) on the other. DualPipe overlaps each pair's compute with the other's
    communication (MoE all-to-all); a rank here runs the pair one after the other. Rank r's
    eight phases (W: the oldest weight gradient still waiting):

        1 nF0       2(P-r-1) x F chunk 0
        2 nF0F1     r+1 x (F chunk 0, F chunk 1)
        3 nB1W1F1   P-r-1 x (B chunk 1 and its W later, W, F chunk 1)
        4 main      M-2P+r+1 x (F chunk 0 with B W chunk 1, F chunk 1 with B W chunk 0)
        5 nB1F1B0   P-r-1 x (B W chunk 1, F chunk 1 with B W chunk 0)
        6 nB1B0     r+1 x (B chunk 1, B chunk 0), their W waiting from the middle pair on
        7 nWB0      P-r-1 x (W, B chunk 0 and its W later)
        8 nW        the r+1 W still waiting

    It needs M >= 2P. With F = B = W (each one chunk's) a rank idles (P-1) F, like ZB-V,
    and holds 2P+1 chunk micro-batches, one more (DualPipe's "PP+1"). DualPipe's published
    bubble, (P-1)(F&B + B - 3W) with B the whole backward, counts a pair as one unit: run
    one after the other here, a forward need not wait for its pair's gradient, and the
    simulated bubble is no larger in any case tested. P=2, M=4:

        step   0    1    2    3    4    5    6    7    8    9    10   11   12
        rank0: F0   F1   F2   F0:1 B0:1 W0:1 F1:1 F3   B1:1 W1:1 F2:1 B0   W0
        rank1: .    F0   F0:1 F1   F1:1 F2   B0:1 W0:1 F2:1 B0   W0   F3   B1:1
        step   13   14   15   16   17   18   19   20   21   22   23   24
        rank0: B2:1 W2:1 F3:1 B1   W1   B3:1 W3:1 B2   W2   .    B3   W3
        rank1: W1:1 F3:1 B1   W1   B2:1 W2:1 B2   W2   B3:1 B3   W3:1 W3
    """
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
            backward = _next_action(done, "B", chunk)
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
    return Schedule("dualpipe-v", stages, micro_batches, actions, chunks=2, split_backward=True,
                    v_shape=True)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved-1f1b": interleaved_1f1b,
             "zb-h1": zb_h1, "zb-v": zb_v, "dualpipe-v": dualpipe_v}
CHUNKS = {"interleaved-1f1b": 2, "zb-v": 2, "dualpipe-v": 2}   # default chunks per rank; else 1


def with_deferred_wgrad(schedule):
    """Deferred weight gradients (Megatron's --defer-embedding-wgrad-compute, here for every
    layer): B computes only the input gradient, and each chunk's W runs once, at the
    flush, over the rows of all M micro-batches. A Dense's weight gradient is then one
    matrix product summing over the step's rows, not M products over a micro-batch's rows
    each added to the sum: the product a single process runs on the whole batch, without
    the M - 1 passes over the gradient that adding costs. The price: every micro-batch
    holds its layer inputs and output gradients until the flush (GPipe's M in flight), and
    no W fills the bubble. 1F1B, P=2, M=4 (`W*` takes M ticks):

        rank0: F0 F1 .  B0 F2 B1 F3 B2 .  B3 W* W* W* W*
        rank1: .  F0 B0 F1 B1 F2 B2 F3 B3 W* W* W* W*

    The chunk whose last B comes first runs its W first.
    """
    actions = []
    for order in schedule.actions:
        kept = [a for a in order if a.kind != "W"]
        last_b = {a.chunk: i for i, a in enumerate(kept) if a.kind == "B"}
        actions.append(kept + [Action("W", EVERY, c) for c in sorted(last_b, key=last_b.get)])
    return replace(schedule, actions=actions, split_backward=True, defer_wgrad=True)


def make_schedule(name, stages, micro_batches, chunks=1, defer_wgrad=False):
    """The named schedule's compute actions (`chunks` model chunks per rank: any number for
    interleaved 1F1B, 2 for ZB-V and DualPipeV, else 1), its W deferred to the flush when
    `defer_wgrad`."""
    schedule = _named_schedule(name, stages, micro_batches, chunks)
    return with_deferred_wgrad(schedule) if defer_wgrad else schedule


def _named_schedule(name, stages, micro_batches, chunks):
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    if name == "interleaved-1f1b":
        return interleaved_1f1b(stages, micro_batches, chunks)
    if chunks != CHUNKS.get(name, 1):
        raise ValueError(f"chunks={chunks}: schedule={name!r} runs {CHUNKS.get(name, 1)} chunk(s) "
                         "per rank; only interleaved-1f1b takes other counts")
    return SCHEDULES[name](stages, micro_batches)


def forward_only(schedule):
    """Inference with `schedule`'s placement: every micro-batch's forward through each chunk
    in turn (GPipe's first half)."""
    F = [Action("F", m, c) for c in range(schedule.chunks) for m in range(schedule.micro_batches)]
    return Schedule("forward-only", schedule.stages, schedule.micro_batches,
                    [list(F) for _ in range(schedule.stages)], schedule.chunks,
                    v_shape=schedule.v_shape)


def _messages(schedule, rank, action):
    """(receives needed before, sends produced after) a compute action, as comm Actions."""
    vs, last = schedule.virtual_stage(rank, action.chunk), schedule.virtual_stages - 1
    recvs, sends = [], []

    def comm(kind, other_vs):
        message = Action(kind, action.mb, action.chunk, schedule.rank_of(other_vs))
        key = message_key(schedule, rank, message)
        return replace(message, tag=message_tag(key, schedule.virtual_stages),
                       boundary=max(vs, other_vs))

    before, after = vs > 0 and not schedule.holds(rank, vs - 1), \
        vs < last and not schedule.holds(rank, vs + 1)      # a neighbour on this rank: no message
    if action.kind == "F":
        recvs += [comm(RECV_F, vs - 1)] if before else []
        sends += [comm(SEND_F, vs + 1)] if after else []
    elif action.kind == "B":
        recvs += [comm(RECV_B, vs + 1)] if after else []
        sends += [comm(SEND_B, vs - 1)] if before else []
    return recvs, sends


def lower(schedule):
    """Insert the sends and receives around the compute actions.

    A receive must come before the compute that needs its tensor; a send comes after the
    compute that made it, as soon as the receiver takes it. With blocking messages the order
    decides whether neighbours hang sending to each other (1F1B's steady state: send this
    forward's activation, receive an earlier micro-batch's gradient). So we play the
    schedule once, logically, and write each rank's messages down in the order in which
    they pair up. When every rank is stuck, one with only sends left goes on computing and
    sends later (interleaved schedules need this: Megatron posts such sends and receives
    together). Of the ranks that can compute, the one that has computed least goes first,
    so messages pair in about the order they would in time (ZB-V needs this: played rank
    by rank, its sends pair late and its bubble grows with M). A fixed order per rank
    pairs the same way in the real run, whatever the timing, so the lowered schedule
    cannot deadlock.
    """
    compute = schedule.actions
    ranks = len(compute)
    out = [[] for _ in range(ranks)]
    position = [0] * ranks
    recvs = [_messages(schedule, r, compute[r][0])[0] if compute[r] else [] for r in range(ranks)]
    sends = [[] for _ in range(ranks)]

    def pair(rank):
        """Complete every message of `rank` whose counterpart the peer is ready for."""
        moved = False
        for action in list(sends[rank]) + list(recvs[rank]):
            mine = sends[rank] if action.kind[0] == "s" else recvs[rank]
            theirs = recvs[action.peer] if action.kind[0] == "s" else sends[action.peer]
            key = message_key(schedule, rank, action)
            for other in theirs:
                if other.peer == rank and message_key(schedule, action.peer, other) == key:
                    out[rank].append(action)
                    out[action.peer].append(other)
                    mine.remove(action)
                    theirs.remove(other)
                    moved = True
                    break
        return moved

    def ready(rank, carry_sends):
        """The rank's next compute may run: its receives are done (and its sends, unless
        they may be carried past it)."""
        return (position[rank] < len(compute[rank]) and not recvs[rank]
                and (carry_sends or not sends[rank]))

    def advance_least_computed(carry_sends):
        """Run the next compute of the ready rank that has computed least; False if none."""
        able = [r for r in range(ranks) if ready(r, carry_sends)]
        if not able:
            return False
        rank = min(able, key=lambda r: position[r])
        action = compute[rank][position[rank]]
        out[rank].append(action)
        position[rank] += 1
        sends[rank] += _messages(schedule, rank, action)[1]
        if position[rank] < len(compute[rank]):
            recvs[rank] = _messages(schedule, rank, compute[rank][position[rank]])[0]
        return True

    while any(position[r] < len(compute[r]) or sends[r] or recvs[r] for r in range(ranks)):
        moved = any([pair(rank) for rank in range(ranks)])     # a list: every rank pairs
        if not advance_least_computed(carry_sends=False) and not moved and \
                not advance_least_computed(carry_sends=True):
            stuck = {r: [str(a) for a in sends[r] + recvs[r]] for r in range(ranks) if sends[r] or recvs[r]}
            raise ValueError(f"schedule {schedule.name!r} can never complete: messages that no "
                             f"rank will ever pair, per rank: {stuck}")
    return replace(schedule, actions=out)


def message_key(schedule, rank, action):
    """What a comm action carries: (F or B, micro-batch, receiving virtual stage).
    A send and a receive match exactly when their keys are equal."""
    vs = schedule.virtual_stage(rank, action.chunk)
    if action.kind == SEND_F:
        return ("F", action.mb, vs + 1)
    if action.kind == SEND_B:
        return ("B", action.mb, vs - 1)
    return (action.kind[1], action.mb, vs)


def message_tag(key, virtual_stages):
    """The wire tag of the message with `message_key` key: one per (F or B, micro-batch,
    receiving virtual stage)."""
    kind, mb, vs = key
    return (mb * virtual_stages + vs) * 2 + (kind == "B")


def peak_in_flight(schedule, rank, through="W"):
    """Most micro-batches (of one chunk's layers) `rank` holds activations of at once:
    forwarded, and not yet past their last backward piece (W when the backward is split: a
    waiting W keeps the layer inputs); `through="B"` stops counting at B."""
    release = "W" if through == "W" and schedule.split_backward else "B"
    held = peak = 0
    for action in schedule.actions[rank]:
        if action.kind == release:
            held -= len(schedule.micro_batches_of(action))
        held += action.kind == "F"
        peak = max(peak, held)
    return peak


def action_costs(schedule, forward=1.0, backward=1.0, weight=1.0):
    """Durations for the simulator: a schedule that does not split the backward runs B and W
    as one action, so its B costs both."""
    full = backward if schedule.split_backward else backward + weight
    return {"F": forward, "B": full, "W": weight}
