"""Replaying a schedule on a virtual clock, without any device.

A compute action takes its cost in time; a send and its receive complete together once
both stages reach them (NCCL's and MPI Ssend's semantics). If no stage can move, the
schedule would hang on real hardware: `Deadlock` names every stage and what it waits for."""
from dataclasses import dataclass

from pipe.schedule import lower, message_key
from pipe.schedules import make_schedule, micro_batches_of

__all__ = ["simulate", "Timeline", "Deadlock", "format_table", "format_position",
           "checked_schedule"]


class Deadlock(RuntimeError):
    """The schedule cannot finish: `waiting[stage]` is the action each stuck stage is on."""

    def __init__(self, schedule, position, reason):
        self.waiting = {r: schedule.actions[r][i] for r, i in enumerate(position)
                        if i < len(schedule.actions[r])}
        lines = [f"schedule {schedule.name!r} (P={schedule.stages}, M={schedule.micro_batches}) "
                 f"deadlocks: {reason}"]
        for stage, action in self.waiting.items():
            lines.append(f"  stage {stage} waits at step {position[stage]}: {action} "
                         f"(peer stage {action.peer})")
        super().__init__("\n".join(lines))


@dataclass
class Timeline:
    """When each compute action ran: spans[stage] = [(start, end, Action), ...]."""

    spans: list
    makespan: float

    def busy(self, stage):
        return sum(end - start for start, end, _ in self.spans[stage])

    @property
    def bubble(self):
        """Fraction of stage-time spent idle: 1 - busy / (stages x makespan)."""
        total = len(self.spans) * self.makespan
        return 1 - sum(self.busy(r) for r in range(len(self.spans))) / total if total else 0.0


def simulate(schedule, costs=None, eager_sends=False):
    """Run a lowered schedule on a virtual clock, `costs` per micro-batch (default 1; a W
    deferred to the flush takes M). Blocking sends (the default) check that it cannot hang;
    `eager_sends` (a send returns at once, its receiver takes it in order) give the timing."""
    costs = {"F": 1.0, "B": 1.0, "I": 1.0, "W": 1.0, **(costs or {})}
    acts, stages = schedule.actions, len(schedule.actions)
    position, clock = [0] * stages, [0.0] * stages
    spans = [[] for _ in range(stages)]
    wires = {}                           # (src, dst) -> [(message key, time sent), ...] in flight
    finished = set()                     # (F, B, I or W, micro-batch, virtual stage) computed

    def head(stage):
        return acts[stage][position[stage]] if position[stage] < len(acts[stage]) else None

    def step(stage, action):
        """Try to complete `action` on `stage`; True if it did."""
        if action.is_compute:
            _check_local_input(schedule, position, stage, action, finished)
            finished.add((action.kind, action.mb, schedule.virtual_stage(stage, action.chunk)))
            start = clock[stage]
            clock[stage] += costs[action.kind] * len(micro_batches_of(schedule, action))
            spans[stage].append((start, clock[stage], action))
            position[stage] += 1
            return True
        key = message_key(schedule, stage, action)
        if eager_sends:
            if action.kind[0] == "s":
                wires.setdefault((stage, action.peer), []).append((key, clock[stage]))
            else:
                queue = wires.get((action.peer, stage))
                if not queue:
                    return False
                if queue[0][0] != key:
                    _mismatch(schedule, position, stage, action, queue[0][0])
                clock[stage] = max(clock[stage], queue.pop(0)[1])
            position[stage] += 1
            return True
        other = head(action.peer)
        if (other is None or other.is_compute or other.peer != stage
                or action.kind[0] == other.kind[0]):
            return False                 # the peer is elsewhere, or both send / both receive
        if key != message_key(schedule, action.peer, other):
            _mismatch(schedule, position, stage, action, message_key(schedule, action.peer, other))
        clock[stage] = clock[action.peer] = max(clock[stage], clock[action.peer])
        position[stage] += 1
        position[action.peer] += 1
        return True

    while any(head(r) for r in range(stages)):
        moved = False
        for stage in range(stages):
            while head(stage) is not None and step(stage, head(stage)):
                moved = True
        if not moved:
            raise Deadlock(schedule, position, "no stage can make progress")
    return Timeline(spans, max(clock))


def _check_local_input(schedule, position, stage, action, finished):
    """In a V the last stage hands a tensor between its two chunks itself: its list
    must compute the producer first."""
    vs = schedule.virtual_stage(stage, action.chunk)
    step = {"F": -1, "B": 1, "I": 1}.get(action.kind)
    source = vs + step if step else None
    if source is None or not schedule.holds(stage, source):
        return
    if (action.kind, action.mb, source) not in finished:
        raise Deadlock(schedule, position, f"stage {stage} runs {action} before the {action.kind} "
                       f"of micro-batch {action.mb} on virtual stage {source}, on the same stage, "
                       "whose output it needs")


def _mismatch(schedule, position, stage, action, other_key):
    raise Deadlock(schedule, position, f"stage {stage} and stage {action.peer} exchange different "
                   f"messages ({action} expects {message_key(schedule, stage, action)}, the wire "
                   f"carries {other_key}): a wire that keeps order would deliver the wrong tensor")


def format_table(schedule, timeline=None):
    """The step x stage grid of compute actions ('.' = idle, the bubble)."""
    timeline = timeline or simulate(schedule, eager_sends=True)
    steps = int(round(timeline.makespan))
    grid = [["."] * len(timeline.spans) for _ in range(steps)]
    for stage, spans in enumerate(timeline.spans):
        for start, end, action in spans:
            for t in range(int(round(start)), int(round(end))):
                grid[t][stage] = str(action)
    width = max(len(f"stage{len(timeline.spans) - 1}"),
                *(len(cell) for row in grid for cell in row))
    header = "step " + " ".join(f"stage{r}".ljust(width) for r in range(len(timeline.spans)))
    rows = [f"{t:<4} " + " ".join(cell.ljust(width) for cell in row) for t, row in enumerate(grid)]
    return "\n".join(line.rstrip() for line in [header] + rows)


def format_position(schedule, stage, index, context=6):
    """`stage`'s actions around `index`, one per line, the one at `index` marked."""
    actions = schedule.actions[stage]
    lines = [f"  {i:4d}  {actions[i]}" + ("   <-- HERE" if i == index else "")
             for i in range(max(0, index - context), min(len(actions), index + context + 1))]
    return "\n".join(lines)


def checked_schedule(name, stages, micro_batches, chunks_per_stage=1, defer_wgrad=False):
    """The named schedule with its messages, refused if the simulator finds a deadlock."""
    schedule = lower(make_schedule(name, stages, micro_batches, chunks_per_stage, defer_wgrad))
    simulate(schedule)
    return schedule
