"""How every implementation's step is timed, so that their figures compare (no MindSpore, no
torch: benchmark.py and torch_pipeline.py both import it)."""
import argparse
import contextlib
import os
import statistics
import time

__all__ = ["median_windows", "host_costs", "in_turn", "print_against_first", "add_turn_flags",
           "turn", "add_profile_flag"]


def median_windows(step, warmup, steps, repeats, before=lambda: None, warmed=lambda: None):
    """The median time of `step()` in each of `repeats` windows of `steps` calls, after
    `warmup` calls and `warmed()` (turn's wait); `before()` runs untimed ahead of every
    timed call (torch: a barrier)."""
    for _ in range(warmup):
        step()
    warmed()
    medians = []
    for _ in range(repeats):
        times = []
        for _ in range(steps):
            before()
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return medians


def host_costs(events):
    """{action kind: median microseconds} over a pipe.ops.trace Tracer's spans ("F3",
    "sB1:1" -> "F", "sB")."""
    spans = {}
    for event in events:
        kind = event["name"].split(":")[0].rstrip("0123456789")
        spans.setdefault(kind, []).append(event["dur"])
    return {kind: round(statistics.median(durations)) for kind, durations in spans.items()}


def in_turn(steps, rounds, warmup=10):
    """{name: median seconds} of each of `steps` ({name: step}), the steps called one after
    another `rounds` times, the order rotating each round (each follows each other as
    often), after `warmup` rounds: figures one host's moments cannot favour."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    names, times = list(steps), {name: [] for name in steps}
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(spent) for name, spent in times.items()}


def print_against_first(medians, width):
    """Each median (in_turn's) in milliseconds and as a ratio to the first one's."""
    base = next(iter(medians.values()))
    for name, median in medians.items():
        print(f"{name:{width}s} {median * 1e3:8.3f} ms  {median / base:6.3f}x", flush=True)


def add_profile_flag(parser):
    """--profile DIR: --steps more steps under MindSpore's profiler (benchmarks/busy.py)."""
    parser.add_argument("--profile", metavar="DIR",
                        help="GPU: profile --steps more steps with MindSpore's profiler into DIR "
                             "(needs CUPTI's libcupti.so); benchmarks/busy.py reads each rank's "
                             "busy time")


def folder(text):
    """--turns' value: a folder that exists, echoed when it does not."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    return text


def add_turn_flags(parser):
    """--turns DIR --turn K --of N: a batch of N processes compiles side by side, then each is
    timed alone, in order."""
    parser.add_argument("--turns", type=folder, help="a folder the processes of one batch share")
    parser.add_argument("--turn", type=int, default=0, help="this process's place (0 first)")
    parser.add_argument("--of", type=int, default=0,
                        help="the batch's processes: no one is timed before all are ready")


@contextlib.contextmanager
def turn(args):
    """Around a process's whole run: yields `wait`, which the process calls once compiled and
    warmed up. It writes `ready-K` (K = `args.turn`) in `args.turns`, then returns once all
    `args.of` processes are ready and process K-1 has ended (its `K-1`); this one writes
    `K` when it ends, timed or failed. So no process is timed while another compiles or
    runs: a batch costs the device about one compile, not one per process."""
    def mark(name):
        open(os.path.join(args.turns, name), "w").close()

    def wait():
        if not args.turns:
            return
        mark(f"ready-{args.turn}")
        needed = [f"ready-{k}" for k in range(args.of)] + [str(args.turn - 1)] * (args.turn > 0)
        while not all(os.path.exists(os.path.join(args.turns, name)) for name in needed):
            time.sleep(0.2)
    try:
        yield wait
    finally:
        if args.turns:                   # (a process that failed before it was ready: too)
            mark(f"ready-{args.turn}")
            mark(str(args.turn))
