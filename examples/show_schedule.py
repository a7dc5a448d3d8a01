"""Print a schedule as its table, simulate it, check its messages; or compare every
schedule for one P, M and set of costs.

    python examples/show_schedule.py --schedule zb-h1 --stages 4 --micro-batches 8
    python examples/show_schedule.py --schedule all --stages 4 --micro-batches 8 --cost 1 1 1

Memory is counted per stage in micro-batches of a whole stage's activations, from F until
the last backward piece; `--defer-wgrad` runs every W at the flush (`W*`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # examples/cli.py
from cli import Parser, as_flags, positive_number, run  # noqa: E402
from pipe import schedules  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.ops.simulator import Deadlock, checked_schedule, format_table, simulate  # noqa: E402


def peaks(schedule):
    """Each stage's peak activation memory, in micro-batches of a whole stage."""
    return [schedules.peak_in_flight(schedule, s) / schedule.chunks_per_stage
            for s in range(schedule.stages)]


def messages(schedule):
    return sum(a.kind[0] == "s" for actions in schedule.actions for a in actions)


def compare(stages, micro_batches, chunks_per_stage, cost, defer_wgrad):
    """One line per schedule that takes this P and M: bubble, memory, messages."""
    print(f"P={stages} M={micro_batches}, costs F={cost[0]:g} I={cost[1]:g} W={cost[2]:g}"
          + (", W* at the flush" if defer_wgrad else ""))
    print(f"{'schedule':24} {'bubble':>7}  {'messages':>8}  peak memory per stage (micro-batches)")
    for name in schedules.SCHEDULES:
        v = schedules.CHUNKS_PER_STAGE.get(name, 1)
        if name == "interleaved-1f1b":
            v = chunks_per_stage
        try:
            schedule = checked_schedule(name, stages, micro_batches, v, defer_wgrad)
        except ValueError as e:
            print(f"{name:24} (not for this P and M: {as_flags(str(e))})")
            continue
        timeline = simulate(schedule, schedules.action_costs(schedule, *cost), eager_sends=True)
        label = f"{name} (v={v})" if name == "interleaved-1f1b" else name
        print(f"{label:24} {timeline.bubble:7.4f}  {messages(schedule):8d}  "
              + " ".join(f"{p:g}" for p in peaks(schedule)))


def show(schedule, cost, lowered):
    """One schedule: its table and bubble, memory and messages."""
    timeline = simulate(schedule, schedules.action_costs(schedule, *cost), eager_sends=True)
    print(format_table(schedule, timeline))
    print(f"\ncosts: F={cost[0]:g} I={cost[1]:g} W={cost[2]:g} "
          f"({'I and W separate' if schedules.splits_backward(schedule) else 'B = I + W'}"
          + ("; W* at the flush, all micro-batches at once)" if schedules.defers_wgrad(schedule)
             else ")"))
    print(f"bubble: {timeline.bubble:.4f}")
    print("peak memory per stage (micro-batches, F until the last backward piece):",
          " ".join(f"{p:g}" for p in peaks(schedule)))
    for stage, actions in enumerate(schedule.actions):
        sends = " ".join(f"{a}->{a.peer}" for a in actions if a.kind[0] == "s")
        recvs = " ".join(f"{a}<-{a.peer}" for a in actions if a.kind[0] == "r")
        print(f"stage {stage} sends: {sends or '-'}\nstage {stage} receives: {recvs or '-'}")
        if lowered:
            print(f"stage {stage} actions: " + " ".join(map(str, actions)))


def main(argv=None):
    p = Parser(prog="python examples/show_schedule.py",
               description="Print a schedule, simulate it, check its messages.")
    p.add_argument("--schedule", default="1f1b", choices=sorted(schedules.SCHEDULES) + ["all"])
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--chunks-per-stage", type=int, help="model chunks per stage (interleaved: 2)")
    p.add_argument("--cost", nargs=3, type=positive_number, default=[1, 1, 1], metavar=("F", "I", "W"),
                   help="relative durations of forward, input-gradient and weight-gradient")
    p.add_argument("--defer-wgrad", action="store_true",
                   help="weight gradients at the flush, one W* per chunk over all micro-batches")
    p.add_argument("--lowered", action="store_true", help="also print every stage's action list")
    args = p.parse_args(argv)
    run(lambda: print_schedules(args))   # a refused value: one line, exit code 2


def print_schedules(args):
    """The schedule asked for, or every schedule (`all`), for the flags' P, M and costs."""
    name = "interleaved-1f1b" if args.schedule == "all" else args.schedule   # all: its v
    config = PipelineConfig(stages=args.stages, micro_batches=args.micro_batches, schedule=name,
                            chunks_per_stage=args.chunks_per_stage, batch_size=args.micro_batches)
    config.check()
    if args.schedule == "all":
        return compare(args.stages, args.micro_batches, config.chunks_per_stage, args.cost,
                       args.defer_wgrad)
    try:
        schedule = checked_schedule(args.schedule, args.stages, args.micro_batches,
                                    config.chunks_per_stage, args.defer_wgrad)
    except Deadlock as e:
        raise SystemExit(str(e))
    show(schedule, args.cost, args.lowered)


if __name__ == "__main__":
    main()
