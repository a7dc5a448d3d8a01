"""The small MLP's step, MindSpore's own against pipe's, step by step in turn (the order
rotating each round), with what pipe's `train_step` adds taken apart: its graph called
alone (the same inputs each call), the graph called as `run_actions` calls it (every
input built, `StepGraph.call`), and `train_step` with Python's garbage collector off.

    python benchmarks/probes/small_turns.py [--device GPU] [--steps 400] [--precision fp16]

Prints each one's median milliseconds and its ratio to MindSpore's step."""
import gc
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import ab_small  # noqa: E402
from timing import in_turn, print_against_first  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, add_memory_plan_flag, positive_int, use_device  # noqa: E402
from pipe.core.engine import split  # noqa: E402


def collector_off(step):
    def run():
        gc.disable()
        try:
            return step()
        finally:
            gc.enable()
    return run


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["CPU", "GPU"], default="GPU")
    p.add_argument("--steps", type=positive_int, default=400)
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="fp16: MindSpore's loss-scaled O2 step against pipe's fp16 (GPU only)")
    add_memory_plan_flag(p)
    args = p.parse_args(argv)
    if args.precision == "fp16" and args.device != "GPU":
        p.error("--precision fp16: MindSpore's loss-scaled step checks overflow with an Ascend "
                "operator on CPU; use --device GPU")
    use_device(args.device, args.memory_plan)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, y = ab_small.batch()
    pipe, graph, engine = ab_small.pipe_step(args.device, x, y, args.precision)
    batch = split(engine.config, x, y, 0)
    called = engine.graphs[batch.shapes]

    def as_run_actions_calls_it():
        masks = engine.dropout_masks(batch, engine.links[batch.shapes])
        inputs = engine.graph_inputs(called, batch, masks, engine.loss_grad_scale(None))
        return called.call(*inputs)[0].asnumpy().item()

    steps = {"MindSpore's step": ab_small.mindspore_step(x, y, args.precision), "pipe's train_step": pipe,
             "its graph alone": graph, "its graph as run_actions calls it": as_run_actions_calls_it,
             "train_step, collector off": collector_off(pipe)}
    print_against_first(in_turn(steps, args.steps), 36)


if __name__ == "__main__":
    cli.run(main)
