"""Project the large MLP's step on more GPUs from a trace recorded on 2 (a projection,
not a measurement: benchmarks/log.md, section 10, checks one against a real run).

    python benchmarks/probes/project.py docs/traces/trace-large-2x1-zb-h1.json --schedule zb-h1 --stages 4 8

The trace gives the median F, B and W of one micro-batch on one of 2 stages. With P
stages and the benchmark's M = 4P micro-batches of the same global batch, a stage holds
2/P of the layers and a micro-batch 2/P of the rows, so each action costs (2/P)^2 of the
traced one; the simulator replays the schedule with those costs. Not modelled: the
host's time per action, the messages, and the step's all-reduce, optimizer and loss.
Check a projection with `./run_mnist_benchmark.sh --model large --layout Px1 --schedule S`.
"""
import sys

from pipe.cli import Parser
from pipe.config import as_flags
from pipe.schedules import action_costs
from pipe.simulator import checked_schedule, measured_costs, simulate


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a trace of the large MLP on 2 stages (run_mnist_benchmark.sh --trace)")
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--stages", type=int, nargs="+", default=[4, 8])
    args = p.parse_args(argv)
    try:
        f, b, w = measured_costs(args.trace)
        schedules = [checked_schedule(args.schedule, P, 4 * P) for P in args.stages]
    except (OSError, ValueError, KeyError) as e:   # one line naming the value, exit code 2
        print(f"error: {as_flags(str(e))}", file=sys.stderr)
        raise SystemExit(2)
    print(f"traced on 2 stages: F={f:.3f} B={b:.3f} W={w:.3f} ms per micro-batch")
    print("schedule  P  M   projected step, ms  bubble")
    for schedule in schedules:
        scale = (2 / schedule.stages) ** 2
        timeline = simulate(schedule, action_costs(schedule, f * scale, b * scale, w * scale),
                            eager_sends=True)
        print(f"{args.schedule:8}  {schedule.stages}  {schedule.micro_batches:<3} "
              f"{timeline.makespan:18.1f}  {timeline.bubble:.3f}")


if __name__ == "__main__":
    main()
