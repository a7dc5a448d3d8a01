"""Schedules as data: for every stage, the ordered list of actions it runs in one step.

A compute action is F (forward) or B (backward) of one micro-batch on one of the stage's
model chunks. `lower()` adds the messages between stages; the engine only executes the
list. Stages are the pipeline's positions; the engine maps each to a rank."""
from dataclasses import dataclass, field, replace
from typing import Optional

__all__ = ["Action", "Schedule", "gpipe", "one_f_one_b", "lower", "message_key", "message_tag"]

# What a compute action hands on: an activation (F) or a gradient (B; I, pipe.schedules' half B).
HANDS_ON = {"F": "F", "B": "B", "I": "B"}


@dataclass(frozen=True)
class Action:
    """One thing a stage does: `F3` (forward of micro-batch 3), `B3:1` (its backward on chunk
    1), `I3` / `W3` (its halves: input, weight gradients), `W*` (W of every micro-batch, `mb`
    None), `sF3` / `rF3` (send / receive its activation), `sB3` / `rB3` (its gradient).

    `lower` gives a message its `peer` stage, wire `tag` and the `boundary` it crosses (into
    virtual stage b); `pipe.actions.encode` gives each action what its handler reads: the
    tensors in flight it `takes` and `puts` (by wire tag; None: the batch's rows, the loss
    gradient, or nothing), a message's place among the rank's (`message`), and whether a B
    or W `starts_sum` of its chunk's gradients."""

    kind: str
    mb: Optional[int]
    chunk: int = 0
    peer: Optional[int] = None
    tag: Optional[int] = field(default=None, compare=False)
    boundary: Optional[int] = field(default=None, compare=False)
    takes: Optional[int] = None
    puts: Optional[int] = None
    message: Optional[int] = None
    starts_sum: bool = False

    def __str__(self):
        mb = "*" if self.mb is None else self.mb
        return f"{self.kind}{mb}" + (f":{self.chunk}" if self.chunk else "")

    is_compute = property(lambda self: self.kind[0] not in "sr")    # (not a message)


@dataclass
class Schedule:
    """Action lists for P stages, M micro-batches; stage s's chunk c is virtual stage c*P + s."""

    name: str
    stages: int
    micro_batches: int
    actions: list                  # actions[stage] -> [Action, ...]
    chunks_per_stage: int = 1

    virtual_stages = property(lambda self: self.stages * self.chunks_per_stage)

    def stage_of(self, virtual_stage):
        return virtual_stage % self.stages

    def virtual_stage(self, stage, chunk):
        return chunk * self.stages + stage

    def holds(self, stage, virtual_stage):
        """Whether `virtual_stage` runs on `stage` (a neighbour there: no message)."""
        return 0 <= virtual_stage < self.virtual_stages and self.stage_of(virtual_stage) == stage

    @property
    def free_tag(self):
        """A tag no message of this schedule uses (the shapes' exchange before the first step)."""
        return message_tag(("F", self.micro_batches, 0), self.virtual_stages)


def gpipe(stages, micro_batches):
    """All forwards, then all backwards (Huang et al., 2019). P=3, M=4, one tick per action:

        stage0: F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
        stage1: .  F0 F1 F2 F3 .  .  B0 B1 B2 B3
        stage2: .  .  F0 F1 F2 F3 B0 B1 B2 B3

    Simple, but every stage holds the activations of all M micro-batches at once."""
    F = [Action("F", m) for m in range(micro_batches)]
    B = [Action("B", m) for m in range(micro_batches)]
    return Schedule("gpipe", stages, micro_batches, [F + B for _ in range(stages)])


def one_f_one_b(stages, micro_batches):
    """1F1B (PipeDream-Flush, Narayanan et al., 2021; MindSpore's pipeline order).

    Stage s runs P-s-1 warm-up forwards, then alternates one forward and one backward in the
    steady state, then drains the remaining backwards in the cool-down:

        stage0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3   warm-up F0 F1 | steady F2 B0 F3 B1 |
                                                      cool-down B2 B3
        stage1: .  F0 F1 .  B0 F2 B1 F3 B2 .  B3
        stage2: .  .  F0 B0 F1 B1 F2 B2 F3 B3

    Same bubble as GPipe, but stage s never holds more than P-s micro-batches' activations."""
    actions = []
    for stage in range(stages):
        warmup = min(stages - stage - 1, micro_batches)
        order = [Action("F", m) for m in range(warmup)]
        for i in range(micro_batches - warmup):                 # steady state
            order += [Action("F", warmup + i), Action("B", i)]
        order += [Action("B", m) for m in range(micro_batches - warmup, micro_batches)]  # cool-down
        actions.append(order)
    return Schedule("1f1b", stages, micro_batches, actions)


def message_key(schedule, stage, action):
    """The one name of a tensor in flight, sent, received or computed from: (F for an
    activation or B for a gradient, micro-batch, the virtual stage that takes it)."""
    vs = schedule.virtual_stage(stage, action.chunk)
    to = {"sF": vs + 1, "sB": vs - 1}.get(action.kind, vs)
    return HANDS_ON.get(action.kind, action.kind[-1]), action.mb, to


def message_tag(key, virtual_stages):
    """A message key as one integer: the wire tag."""
    kind, mb, vs = key
    return (mb * virtual_stages + vs) * 2 + (kind == "B")


def _messages(schedule, stage, action):
    """(receives needed before, sends produced after) a compute action."""
    vs, kind = schedule.virtual_stage(stage, action.chunk), HANDS_ON.get(action.kind)
    if kind is None:
        return [], []
    source, to = (vs - 1, vs + 1) if kind == "F" else (vs + 1, vs - 1)

    def message(direction, other):
        m = Action(direction + kind, action.mb, action.chunk, schedule.stage_of(other))
        return replace(m, tag=message_tag(message_key(schedule, stage, m), schedule.virtual_stages),
                       boundary=max(vs, other))

    def crosses(other):          # a neighbour on this stage, or none: no message
        return 0 <= other < schedule.virtual_stages and not schedule.holds(stage, other)

    return ([message("r", source)] if crosses(source) else [],
            [message("s", to)] if crosses(to) else [])


def lower(schedule):
    """Insert the sends and receives around the compute actions. Blocking messages hang if
    misordered, so the schedule is played once and each stage's messages written down in
    the order they pair up: it cannot deadlock, whatever the timing. When all are stuck, a
    stage with only sends left computes on (interleaved schedules need this); the one that
    has computed least goes first (ZB-V needs this)."""
    compute = schedule.actions
    stages = range(len(compute))
    out = [[] for _ in stages]
    position = [0 for _ in stages]
    recvs = [_messages(schedule, s, compute[s][0])[0] if compute[s] else [] for s in stages]
    sends = [[] for _ in stages]

    def pair(stage):
        """Complete every message of `stage` whose counterpart the peer is ready for."""
        moved = False
        for action in sends[stage] + recvs[stage]:
            mine, theirs = (sends[stage], recvs[action.peer]) if action.kind[0] == "s" else \
                (recvs[stage], sends[action.peer])
            key = message_key(schedule, stage, action)
            match = [o for o in theirs
                     if o.peer == stage and message_key(schedule, action.peer, o) == key]
            if match:
                out[stage].append(action)
                out[action.peer].append(match[0])
                mine.remove(action)
                theirs.remove(match[0])
                moved = True
        return moved

    def advance_least_computed(carry_sends):
        """Run the next compute of the ready stage that has computed least; False if none."""
        able = [s for s in stages if position[s] < len(compute[s]) and not recvs[s]
                and (carry_sends or not sends[s])]
        if not able:
            return False
        s = min(able, key=lambda s: position[s])
        out[s].append(compute[s][position[s]])
        sends[s] += _messages(schedule, s, compute[s][position[s]])[1]
        position[s] += 1
        if position[s] < len(compute[s]):
            recvs[s] = _messages(schedule, s, compute[s][position[s]])[0]
        return True

    while any(position[s] < len(compute[s]) or sends[s] or recvs[s] for s in stages):
        moved = any([pair(s) for s in stages])     # a list: every stage pairs
        if not advance_least_computed(carry_sends=False) and not moved and \
                not advance_least_computed(carry_sends=True):
            stuck = {s: [str(a) for a in sends[s] + recvs[s]]
                     for s in stages if sends[s] or recvs[s]}
            raise ValueError(f"schedule {schedule.name!r} can never complete: messages that no "
                             f"stage will ever pair, per stage: {stuck}")
    return replace(schedule, actions=out)
