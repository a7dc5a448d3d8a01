"""pipe's command line: print a schedule as its table, simulate it, check its messages.

    python -m pipe --schedule zb-h1 --stages 4 --micro-batches 8
    python -m pipe --schedule 1f1b --stages 2 --micro-batches 8 --measured trace.json

The bubble it reports comes from the simulated timeline with the costs it prints
(`--cost F B W`, or measured from a recorded trace).
"""
import argparse
import sys

from pipe import schedule as schedules
from pipe.config import PipelineConfig, as_flags
from pipe.simulator import Deadlock, format_table, measured_costs, simulate


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pipe",
                                description="Print a schedule, simulate it, check its messages.")
    p.add_argument("--schedule", default="1f1b", choices=sorted(schedules.SCHEDULES))
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--chunks", type=int, help="chunks per rank (interleaved: 2)")
    p.add_argument("--cost", nargs=3, type=float, default=[1, 1, 1], metavar=("F", "B", "W"),
                   help="relative durations of forward, input-gradient and weight-gradient")
    p.add_argument("--measured", metavar="TRACE", help="take F/B/W costs from a recorded trace")
    p.add_argument("--lowered", action="store_true", help="also print every rank's action list")
    args = p.parse_args(argv)
    try:
        config = PipelineConfig(stages=args.stages, micro_batches=args.micro_batches,
                                schedule=args.schedule, chunks=args.chunks,
                                batch_size=args.micro_batches)
        config.check()
        chunks = config.chunks
        schedule = schedules.lower(schedules.make_schedule(args.schedule, args.stages,
                                                           args.micro_batches, chunks))
    except ValueError as e:          # one line naming the value and the fix, exit code 2
        print(f"error: {as_flags(str(e))}", file=sys.stderr)
        raise SystemExit(2)
    f, b, w = measured_costs(args.measured, schedule) if args.measured else args.cost
    costs = schedules.action_costs(schedule, f, b, w)
    try:
        simulate(schedule)                                   # can it hang?
    except Deadlock as e:
        raise SystemExit(str(e))
    timeline = simulate(schedule, costs, eager_sends=True)    # how long does it take?
    print(format_table(schedule))
    print(f"\ncosts: F={costs['F']:g} B={costs['B']:g} W={costs['W']:g} "
          f"({'B and W separate' if schedule.split_backward else 'B includes W'})")
    print(f"bubble: {timeline.bubble:.4f}")
    print("peak in-flight micro-batches per rank (F done, B not):",
          [schedules.peak_in_flight(schedule, r) for r in range(args.stages)])
    for rank, actions in enumerate(schedule.actions):
        sends = " ".join(f"{a}->{a.peer}" for a in actions if a.kind[0] == "s")
        recvs = " ".join(f"{a}<-{a.peer}" for a in actions if a.kind[0] == "r")
        print(f"rank {rank} sends: {sends or '-'}\nrank {rank} receives: {recvs or '-'}")
        if args.lowered:
            print(f"rank {rank} actions: " + " ".join(map(str, actions)))


if __name__ == "__main__":
    main()
