"""What skipping a step on an overflow costs the GPT in fp16 (one GPU): MindSpore's own
steps with and without the skip (pipe skips, as one process's recipe does).

    python benchmarks/probes/skip_cost.py --impl own|own-skip|mindspore-o2 [gpt_benchmark.py's flags]

`own` is benchmarks/gpt_benchmark.py's OwnStep (the loss x S, the gradients / S, checked
finite, Adam always steps); `own-skip` the same with `if finite:` before Adam (control flow
in the graph); `mindspore-o2` MindSpore's nn.TrainOneStepWithLossScaleCell with its
DynamicLossScaleUpdateCell (S from 2**16), one ms.jit: gpt_benchmark.LossScaledStep, the
benchmark's fp16 reference since this probe. Prints the median step."""
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
from mindspore import ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gpt_benchmark as bench  # noqa: E402
from benchmark import peak_memory  # noqa: E402
from timing import median_windows  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.builders import LayerBuilders  # noqa: E402
from pipe.cli import Parser, use_device  # noqa: E402


class OwnSkip(bench.OwnStep):
    """OwnStep, Adam only when every gradient is finite."""

    @ms.jit
    def construct(self, ids, targets):
        loss, grads = self.grad(ids, targets)
        grads, finite = self.unscaled(grads)
        if finite:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss / self.scale, finite


def mindspore_step(args):
    model = LayerBuilders(bench.layers(args), 0).whole()
    for layer in model.cells():
        layer.to_float(ms.float16)
    ids, targets = map(ms.Tensor, bench.data(args))
    if args.impl == "mindspore-o2":
        step = bench.LossScaledStep(model)
    else:
        step = (OwnSkip if args.impl == "own-skip" else bench.OwnStep)(model, True)
    return lambda: step(ids, targets)[0].asnumpy()


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["own", "own-skip", "mindspore-o2"], required=True)
    known, rest = p.parse_known_args(argv)
    args = bench.parse_args(rest + ["--impl", "mindspore", "--precision", "fp16"])
    args.impl = known.impl
    device = use_device(args.device if args.device != "auto" else "GPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    windows = median_windows(mindspore_step(args), args.warmup, args.steps, args.repeats)
    print(f"{args.impl} fp16: {sorted(windows)[len(windows) // 2] * 1e3:.1f} ms per step, peak "
          f"{peak_memory(device) / 2**30:.2f} GiB", flush=True)


if __name__ == "__main__":
    cli.run(main)
