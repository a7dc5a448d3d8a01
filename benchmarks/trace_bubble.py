"""A recorded step against its schedule: the F, I and W costs of a trace, the bubble the
simulator predicts with them, and the bubble the trace shows.

    python benchmarks/trace_bubble.py trace.json --schedule 1f1b --stages 2 --micro-batches 8

The trace is one `benchmarks/benchmark.py --trace STEM` records (pipe.ops.trace)."""
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from cli import Parser, existing_file, positive_int, run  # noqa: E402
from pipe.ops.simulator import checked_schedule, simulate
from pipe.schedules import CHUNKS_PER_STAGE, SCHEDULES, action_costs


def compute_spans(trace_path):
    """The F, B, I and W spans of a recorded trace; a file that holds none is refused."""
    try:
        with open(trace_path) as f:
            events = json.load(f)["traceEvents"]
    except (ValueError, KeyError, TypeError):    # not JSON, or not a trace
        events = []
    action = re.compile(r"[FBIW](\d+|\*)(:\d+)?")
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
             and action.fullmatch(str(e.get("name")))]
    if not spans:
        raise ValueError(f"{trace_path} holds no F, B, I or W span of a Chrome trace: give one "
                         "that `benchmarks/benchmark.py --trace STEM` recorded")
    return spans


def measured_costs(spans):
    """(F, I, W) median milliseconds per micro-batch of a trace's `spans` (a `W*` counts for
    every micro-batch; without I and W, B stands for I and W is 0)."""
    micro_batches = len({e["name"].split(":")[0] for e in spans if e["name"][0] == "F"})

    def median(kind, share=1):
        durations = [e["dur"] / share for e in spans if e["name"][0] == kind]
        return statistics.median(durations) / 1e3 if durations else 0.0
    deferred = any(e["name"].startswith("W*") for e in spans)
    return median("F"), median("I") or median("B"), median("W", micro_batches if deferred else 1)


def measured_bubble(spans):
    """The recorded step's bubble: the fraction of stage-time none of its `spans` ran."""
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    stages = {e["pid"] for e in spans}
    return 1 - sum(e["dur"] for e in spans) / (len(stages) * (end - start))


def main(argv=None):
    p = Parser(description="A recorded step's costs and bubble against its schedule's.")
    p.add_argument("trace", type=existing_file)
    p.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES))
    p.add_argument("--stages", type=positive_int, default=2)
    p.add_argument("--micro-batches", type=positive_int, default=8)
    p.add_argument("--defer-wgrad", action="store_true")
    args = p.parse_args(argv)
    schedule = checked_schedule(args.schedule, args.stages, args.micro_batches,
                                CHUNKS_PER_STAGE.get(args.schedule, 1), args.defer_wgrad)
    spans = compute_spans(args.trace)
    cost = measured_costs(spans)
    simulated = simulate(schedule, action_costs(schedule, *cost), eager_sends=True).bubble
    print(f"costs (ms): F={cost[0]:g} I={cost[1]:g} W={cost[2]:g}")
    print(f"bubble: {simulated:.4f} simulated, {measured_bubble(spans):.4f} in the trace")


if __name__ == "__main__":
    run(main)
