"""Replaying a schedule with blocking send/receive semantics, without any device.

Every rank walks its action list. A compute action takes its cost in time; a send and its
receive complete together, only once both ranks have reached them (the strictest,
synchronous semantics: NCCL-like, and MPI's Ssend). If no rank can move, the schedule
would hang on real hardware: `Deadlock` names every rank and what it waits for.
"""
from dataclasses import dataclass

from pipe.schedule import lower, make_schedule, message_key

__all__ = ["simulate", "Timeline", "Deadlock", "format_table", "format_position",
           "checked_schedule", "measured_costs", "measured_bubble"]


class Deadlock(RuntimeError):
    """The schedule cannot finish: `waiting[rank]` is the action each stuck rank is on."""

    def __init__(self, schedule, position, reason):
        self.waiting = {r: schedule.actions[r][i] for r, i in enumerate(position)
                        if i < len(schedule.actions[r])}
        lines = [f"schedule {schedule.name!r} (P={schedule.stages}, M={schedule.micro_batches}) "
                 f"deadlocks: {reason}"]
        for rank, action in self.waiting.items():
            lines.append(f"  rank {rank} waits at step {position[rank]}: {action} "
                         f"(peer rank {action.peer})")
        super().__init__("\n".join(lines))


@dataclass
class Timeline:
    """When each compute action ran: spans[rank] = [(start, end, Action), ...]."""

    spans: list
    makespan: float

    def busy(self, rank):
        return sum(end - start for start, end, _ in self.spans[rank])

    @property
    def bubble(self):
        """Fraction of rank-time spent idle: 1 - busy / (ranks x makespan)."""
        total = len(self.spans) * self.makespan
        return 1 - sum(self.busy(r) for r in range(len(self.spans))) / total if total else 0.0


def simulate(schedule, costs=None, eager_sends=False):
    """Run a lowered schedule on a virtual clock. `costs` maps F/B/W to durations (default
    1) per micro-batch: a W deferred to the flush takes M of them.

    With blocking sends (the default) a send waits for its receive: this is the check that
    the schedule cannot hang. With `eager_sends` a send returns at once and its receiver
    takes the message whenever it gets there, in order per pair of ranks (what NCCL's
    queued sends and MPI's buffered ones give): this is the timing to expect.
    """
    costs = {"F": 1.0, "B": 1.0, "W": 1.0, **(costs or {})}
    acts = schedule.actions
    ranks = len(acts)
    position, clock = [0] * ranks, [0.0] * ranks
    spans = [[] for _ in range(ranks)]
    wires = {}                           # (src, dst) -> [(message key, time sent), ...] in flight
    finished = set()                     # (F or B or W, micro-batch, virtual stage) computed

    def head(rank):
        return acts[rank][position[rank]] if position[rank] < len(acts[rank]) else None

    def step(rank, action):
        """Try to complete `action` on `rank`; True if it did."""
        if action.is_compute:
            _check_local_input(schedule, position, rank, action, finished)
            finished.add((action.kind, action.mb, schedule.virtual_stage(rank, action.chunk)))
            start = clock[rank]
            clock[rank] += costs[action.kind] * len(schedule.micro_batches_of(action))
            spans[rank].append((start, clock[rank], action))
            position[rank] += 1
            return True
        key = message_key(schedule, rank, action)
        if eager_sends:
            if action.kind[0] == "s":
                wires.setdefault((rank, action.peer), []).append((key, clock[rank]))
            else:
                queue = wires.get((action.peer, rank))
                if not queue:
                    return False
                if queue[0][0] != key:
                    _mismatch(schedule, position, rank, action, queue[0][0])
                clock[rank] = max(clock[rank], queue.pop(0)[1])
            position[rank] += 1
            return True
        other = head(action.peer)
        if other is None or other.is_compute or other.peer != rank or action.kind[0] == other.kind[0]:
            return False                 # the peer is elsewhere, or both send / both receive
        if key != message_key(schedule, action.peer, other):
            _mismatch(schedule, position, rank, action, message_key(schedule, action.peer, other))
        clock[rank] = clock[action.peer] = max(clock[rank], clock[action.peer])
        position[rank] += 1
        position[action.peer] += 1
        return True

    while any(head(r) for r in range(ranks)):
        moved = False
        for rank in range(ranks):
            while head(rank) is not None and step(rank, head(rank)):
                moved = True
        if not moved:
            raise Deadlock(schedule, position, "no rank can make progress")
    return Timeline(spans, max(clock))


def _check_local_input(schedule, position, rank, action, finished):
    """In a V (ZB-V, DualPipeV) the last rank holds two neighbouring virtual stages: the
    tensor between them is handed over on the rank, so its list must compute the producer
    first."""
    vs, step = schedule.virtual_stage(rank, action.chunk), {"F": -1, "B": 1}.get(action.kind)
    source = vs + step if step else None
    if source is None or not schedule.holds(rank, source):
        return
    if (action.kind, action.mb, source) not in finished:
        raise Deadlock(schedule, position, f"rank {rank} runs {action} before the {action.kind} "
                       f"of micro-batch {action.mb} on virtual stage {source}, on the same rank, "
                       "whose output it needs")


def _mismatch(schedule, position, rank, action, other_key):
    raise Deadlock(schedule, position, f"rank {rank} and rank {action.peer} exchange different "
                   f"messages ({action} expects {message_key(schedule, rank, action)}, the wire "
                   f"carries {other_key}): a wire that keeps order would deliver the wrong tensor")


def format_table(schedule, timeline=None):
    """The step x rank grid of compute actions ('.' = idle, the bubble), one unit per step
    when every action costs 1 (the default timeline)."""
    timeline = timeline or simulate(schedule, eager_sends=True)
    steps = int(round(timeline.makespan))
    grid = [["."] * len(timeline.spans) for _ in range(steps)]
    for rank, spans in enumerate(timeline.spans):
        for start, end, action in spans:
            for t in range(int(round(start)), int(round(end))):
                grid[t][rank] = str(action)
    width = max(5, *(len(cell) for row in grid for cell in row))
    header = "step " + " ".join(f"rank{r}".ljust(width) for r in range(len(timeline.spans)))
    rows = [f"{t:<4} " + " ".join(cell.ljust(width) for cell in row) for t, row in enumerate(grid)]
    return "\n".join(line.rstrip() for line in [header] + rows)


def format_position(schedule, rank, index, context=6):
    """`rank`'s actions around `index`, one per line, the one at `index` marked."""
    actions = schedule.actions[rank]
    lines = [f"  {i:4d}  {actions[i]}" + ("   <-- HERE" if i == index else "")
             for i in range(max(0, index - context), min(len(actions), index + context + 1))]
    return "\n".join(lines)


def checked_schedule(name, stages, micro_batches, chunks=1, defer_wgrad=False):
    """The named schedule with its messages, refused if the simulator finds a deadlock."""
    schedule = lower(make_schedule(name, stages, micro_batches, chunks, defer_wgrad))
    simulate(schedule)
    return schedule


def _compute_spans(trace_path):
    """The F, B and W spans of a recorded trace (pipe.trace), each {"name", "pid", "ts", "dur"}."""
    import json
    import re
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e["ph"] == "X" and re.fullmatch(r"[FBW](\d+|\*)(:\d+)?", e["name"])]


def measured_costs(trace_path):
    """(F, B, W) median durations per micro-batch from a recorded trace (pipe.trace): a W
    deferred to the flush (`W*`) counts for every micro-batch, as many as there are
    forwards of one chunk. Without W actions in the trace, W is 0 and B is the whole
    backward."""
    import statistics
    spans = _compute_spans(trace_path)
    micro_batches = len({e["name"].split(":")[0] for e in spans if e["name"][0] == "F"})

    def median(kind, share=1):
        durations = [e["dur"] / share for e in spans if e["name"][0] == kind]
        return statistics.median(durations) / 1e3 if durations else 0.0
    deferred = any(e["name"].startswith("W*") for e in spans)
    return median("F"), median("B"), median("W", micro_batches if deferred else 1)


def measured_bubble(trace_path):
    """The recorded step's bubble: the fraction of rank-time, from the first compute to the
    last, that no F, B or W ran (what `Timeline.bubble` predicts)."""
    spans = _compute_spans(trace_path)
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    ranks = {e["pid"] for e in spans}
    return 1 - sum(e["dur"] for e in spans) / (len(ranks) * (end - start))
