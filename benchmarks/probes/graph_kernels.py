"""Which operators each step's compiled graph runs: MindSpore's own step against pipe's.

    python benchmarks/probes/graph_kernels.py --impl mindspore
    python benchmarks/probes/graph_kernels.py --impl pipe [--no-defer-wgrad] [--precision fp16]
    python benchmarks/probes/graph_kernels.py --model gpt --impl {pipe,mindspore} [--micro-batches 4] [--no-defer-wgrad]

The small MLP as the benchmark has it (8 x 1024, B = 64, M = 1), or the GPT example's model,
small (2 blocks of width 64, T = 32, B = 8): MindSpore's own step (gpt_benchmark's) or
pipe's in one graph, at M = 1 or more (what deferring W adds or saves there is counted the
same way; MindSpore's step at M > 1 accumulates the micro-batches' gradients). A step whose device work
is under a millisecond costs what its operators cost to launch, so the count is the
figure: MindSpore writes the kernel graph it builds (`save_graphs`, `graph_build_*.ir`)
and this counts its operators by name (bookkeeping nodes left out), after one step.
"""
import collections
import glob
import os
import re
import shutil
import sys
import tempfile

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchmark import Float32Loss, build_model, own_random_weights  # noqa: E402
from builtin_pipeline import builtin_train_step  # noqa: E402
from pipe import cli  # noqa: E402
from pipe.cli import Parser, add_precision_flag, add_speed_flags, positive_int, use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

LAYERS, HIDDEN, INPUTS, BATCH = 8, 1024, 784, 64
BOOKKEEPING = {"UpdateState", "Load", "MakeTuple", "TupleGetItem", "Depend", "Return", "g",
               "cell", "call", "Partial", "Switch", "RealMakeTuple", "RealTupleGetItem"}


def mindspore_step(device, half, x, y):
    model = build_model(LAYERS, HIDDEN, INPUTS, init="zeros")
    own_random_weights(model, 0, LAYERS + 1, seed=0)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if half:
        for layer in model.cells():
            layer.to_float(ms.float16)
        loss_fn = Float32Loss(loss_fn)
    step = builtin_train_step(model, loss_fn, nn.SGD(model.trainable_params(), 1e-3), 1, 1, None)
    step(ms.Tensor(x), ms.Tensor(y)).asnumpy()


def pipe_step(device, args, x, y):
    model = build_model(LAYERS, HIDDEN, INPUTS, init="zeros")
    config = PipelineConfig(batch_size=BATCH, device=device, precision=args.precision,
                            defer_wgrad=args.defer_wgrad, one_graph=True)
    engine = PipelineEngine(model, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                            lambda ps: nn.SGD(ps, 1e-3), config)
    engine.train_step(ms.Tensor(x), ms.Tensor(y))


def gpt_step(args):
    import gpt_benchmark
    gpt_args = gpt_benchmark.parse_args([
        "--layers", "2", "--width", "64", "--heads", "4", "--context", "32", "--batch-size", "8",
        "--micro-batches", str(args.micro_batches or (4 if args.impl == "pipe" else 1)),
        "--one-graph", "--device", args.device,
        "--precision", args.precision,
        "--defer-wgrad" if args.defer_wgrad is not False else "--no-defer-wgrad"])
    if args.impl == "mindspore":
        gpt_benchmark.mindspore_step(gpt_args, args.device)[0]()
    else:
        gpt_benchmark.pipe_step(gpt_args, args.device)


def operators(directory):
    """[(kernel graph file, {operator name: count})] of every kernel graph MindSpore built,
    largest first: the step's graph, then what ran beside it (pipe's check before the
    first step, its loss's all-reduce)."""
    graphs = []
    for path in glob.glob(os.path.join(directory, "**", "graph_build_*.ir"), recursive=True):
        with open(path) as f:
            names = re.findall(r"^\s*%\S+ = (?:PrimFunc_)?([A-Za-z0-9]+)\(", f.read(), re.M)
        graphs.append((os.path.basename(path), collections.Counter(n for n in names if n not in BOOKKEEPING)))
    return sorted(graphs, key=lambda g: -sum(g[1].values()))


def main():
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=["mindspore", "pipe"], default="pipe")
    p.add_argument("--model", choices=["small", "gpt"], default="small")
    p.add_argument("--device", choices=["CPU", "GPU"], default="CPU")
    p.add_argument("--micro-batches", type=positive_int,
                   help="the GPT's: pipe's (4 unless given), or MindSpore's own step accumulating "
                        "them (gpt_benchmark.AccumulatingStep; the whole batch at once unless given)")
    add_speed_flags(p)
    add_precision_flag(p)
    args = p.parse_args()
    use_device(args.device)
    where = tempfile.mkdtemp(prefix="graph-kernels-")     # (removed at the end)
    ms.set_context(mode=ms.PYNATIVE_MODE, save_graphs=2, save_graphs_path=where)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, INPUTS)).astype(np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.int32)
    if args.model == "gpt":
        gpt_step(args)
    elif args.impl == "mindspore":
        mindspore_step(args.device, args.precision == "fp16", x, y)
    else:
        pipe_step(args.device, args, x, y)
    graphs = operators(where)
    print(f"{args.impl} {args.model} {args.precision}: kernel graphs " +
          ", ".join(f"{name} {sum(c.values())}" for name, c in graphs))
    for name, n in sorted(graphs[0][1].items()):
        print(f"  {n:4d} {name}")
    shutil.rmtree(where, ignore_errors=True)

if __name__ == "__main__":
    cli.run(main)
