"""Pipeline schedules as data: for every rank, the ordered list of actions it performs.

A compute action is F (forward), B (backward) or W (weight gradient, only in schedules that
split the backward), for one micro-batch on one of the rank's model chunks. `lower()` adds
the point-to-point messages; `pipe.simulator` replays the result to check and time it; the
engine only executes it. Printing `format_table()` shows the step x rank grid.
"""
from dataclasses import dataclass, field

__all__ = ["Action", "Schedule", "gpipe", "one_f_one_b", "forward_only", "SCHEDULES", "lower", "message_key", "peak_in_flight"]

COMPUTE = ("F", "B", "W")
SEND_F, RECV_F, SEND_B, RECV_B = "sF", "rF", "sB", "rB"


@dataclass(frozen=True)
class Action:
    """One thing a rank does. Prints as `F3` (forward of micro-batch 3), `B3:1` (backward of
    micro-batch 3 on the rank's model chunk 1), `sF3` / `rF3` (send / receive the activation
    of micro-batch 3), `sB3` / `rB3` (send / receive its gradient); `peer` is the other rank."""

    kind: str
    mb: int
    chunk: int = 0
    peer: int = -1

    def __str__(self):
        return f"{self.kind}{self.mb}" + (f":{self.chunk}" if self.chunk else "")

    @property
    def is_compute(self):
        return self.kind in COMPUTE


@dataclass
class Schedule:
    """Per-rank action lists for P ranks, M micro-batches and v model chunks per rank.

    Rank r's chunk c is virtual stage c*P + r, so with v=1 a rank is simply its stage.
    `split_backward` is True when B computes only the input gradient and W the weights'.
    """

    name: str
    stages: int
    micro_batches: int
    actions: list                  # actions[rank] -> [Action, ...]
    chunks: int = 1
    split_backward: bool = False
    lowered: bool = field(default=False)

    @property
    def virtual_stages(self):
        return self.stages * self.chunks

    def rank_of(self, virtual_stage):
        return virtual_stage % self.stages

    def virtual_stage(self, rank, chunk):
        return chunk * self.stages + rank


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


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def forward_only(stages, micro_batches):
    """Inference: every stage runs every micro-batch's forward, in order (GPipe's first half)."""
    F = [Action("F", m) for m in range(micro_batches)]
    return Schedule("forward-only", stages, micro_batches, [list(F) for _ in range(stages)])


def _messages(schedule, rank, action):
    """(receives needed before, sends produced after) a compute action, as comm Actions."""
    vs, last = schedule.virtual_stage(rank, action.chunk), schedule.virtual_stages - 1
    recvs, sends = [], []

    def comm(kind, other_vs):
        return Action(kind, action.mb, action.chunk, schedule.rank_of(other_vs))

    if action.kind == "F":
        if vs > 0:
            recvs.append(comm(RECV_F, vs - 1))
        if vs < last:
            sends.append(comm(SEND_F, vs + 1))
    elif action.kind == "B":
        if vs < last:
            recvs.append(comm(RECV_B, vs + 1))
        if vs > 0:
            sends.append(comm(SEND_B, vs - 1))
    return recvs, sends


def lower(schedule):
    """Insert the sends and receives around the compute actions.

    A send follows the compute that made its tensor, a receive precedes the compute that
    needs it. Between two computes a rank may hold several of them (1F1B's steady state:
    send this forward's activation, receive an earlier micro-batch's gradient), and with
    blocking messages their order decides whether neighbours hang sending to each other.
    So we play the schedule once, logically, and write each rank's messages down in the
    order in which they can pair up. With a fixed order per rank the real run pairs them
    the same way, whatever the timing, so it cannot deadlock.
    """
    compute = schedule.actions
    ranks = len(compute)
    out = [[] for _ in range(ranks)]
    position = [0] * ranks
    gaps = [_messages(schedule, r, compute[r][0])[0] if compute[r] else [] for r in range(ranks)]

    def counterpart(rank, action):
        key = message_key(schedule, rank, action)
        for other in gaps[action.peer]:
            if other.peer == rank and other.kind[0] != action.kind[0] and \
                    message_key(schedule, action.peer, other) == key:
                return other
        return None

    while any(position[r] < len(compute[r]) or gaps[r] for r in range(ranks)):
        moved = False
        for rank in range(ranks):
            for action in list(gaps[rank]):
                other = counterpart(rank, action)
                if other is not None:
                    out[rank].append(action)
                    out[action.peer].append(other)
                    gaps[rank].remove(action)
                    gaps[action.peer].remove(other)
                    moved = True
            if not gaps[rank] and position[rank] < len(compute[rank]):
                action = compute[rank][position[rank]]
                out[rank].append(action)
                position[rank] += 1
                gaps[rank] = _messages(schedule, rank, action)[1]
                if position[rank] < len(compute[rank]):
                    gaps[rank] += _messages(schedule, rank, compute[rank][position[rank]])[0]
                moved = True
        if not moved:
            stuck = {r: [str(a) for a in gaps[r]] for r in range(ranks) if gaps[r]}
            raise ValueError(f"schedule {schedule.name!r} can never complete: messages that no "
                             f"rank will ever pair, per rank: {stuck}")
    return Schedule(schedule.name, schedule.stages, schedule.micro_batches, out,
                    schedule.chunks, schedule.split_backward, lowered=True)


def message_key(schedule, rank, action):
    """What a comm action carries: (F or B, micro-batch, receiving virtual stage).
    A send and a receive match exactly when their keys are equal."""
    vs = schedule.virtual_stage(rank, action.chunk)
    if action.kind == SEND_F:
        return ("F", action.mb, vs + 1)
    if action.kind == SEND_B:
        return ("B", action.mb, vs - 1)
    return (action.kind[1], action.mb, vs)


def peak_in_flight(schedule, rank):
    """Most micro-batches whose activations `rank` holds at once: forwarded, not yet
    fully backwarded (through W when the backward is split)."""
    release = "W" if schedule.split_backward else "B"
    held = peak = 0
    for action in schedule.actions[rank]:
        held += (action.kind == "F") - (action.kind == release)
        peak = max(peak, held)
    return peak
