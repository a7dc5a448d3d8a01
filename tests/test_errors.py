"""Usage mistakes fail on every rank, before any message, with the values and the fix."""
import subprocess
import sys

import pytest

from launch import ENV, ROOT, run_example

SMALL = ["--layers", "2", "--hidden", "16", "--steps", "1", "--data", "synthetic"]


@pytest.mark.parametrize("ranks,flags,message", [
    (3, ["--stages", 2, "--data-parallel", 2],
     "error: the launcher started 3 processes but --stages 2 x --data-parallel 2 = 4: launch "
     "with -n 4 (mpiexec) or --worker_num=4 (msrun), or change stages and data_parallel so "
     "that their product is 3"),
    (4, ["--stages", 2, "--data-parallel", 2, "--batch-size", 12, "--micro-batches", 4],
     "error: --batch-size 12 cannot be split over --data-parallel 2 replicas x --micro-batches 4: "
     "it must be a multiple of 8; try --batch-size 8"),
    (4, ["--stages", 4, "--layers", 2],
     "error: cannot split 3 layers into --stages 4: every stage needs at least one layer; use "
     "--stages 3 or fewer, or a deeper model"),
    (2, ["--stages", 2, "--schedule", "pipedream"],
     "error: unknown schedule 'pipedream': choose one of gpipe, 1f1b, interleaved-1f1b, zb-h1"),
    (2, ["--stages", 2, "--model", "cnn", "--defer-wgrad", "--timeout", 30],   # batch norm on one stage
     "error: defer_wgrad runs each layer's weight gradient once over the rows of all "
     "micro-batches: batch norm (a layer with buffers) would normalize them by the statistics "
     "of all those rows, not of each micro-batch; turn defer_wgrad off"),
])
def test_mistake_fails_on_every_rank(ranks, flags, message):
    done = run_example(ranks, *SMALL, *flags, timeout=120)
    assert done.returncode != 0
    assert all(message in err for err in done.errs)
    assert "Traceback" not in done.stderr


def test_damaged_mnist_file_is_named(tmp_path):
    import gzip
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(tmp_path / f"{name}.gz", "wb") as f:
            f.write(b"\x00\x00\x08\x03" + b"\x00" * 10)      # a header cut short
    done = run_example(1, "--data", "mnist", "--data-dir", tmp_path, "--steps", 1)
    assert done.returncode == 2
    assert f"error: {tmp_path}/train-images-idx3-ubyte.gz is not a complete MNIST IDX file" in done.stderr


@pytest.mark.parametrize("cmd,message", [
    (["./run_mnist_benchmark.sh", "--layout", "3"],
     "error: --layout 3: use PxD (stages x replicas, e.g. 2x1) or all\n"),
    ([sys.executable, "examples/mnist/benchmark.py", "--batch-size", "30", "--micro-batches", "4"],
     "error: --batch-size 30 cannot be split over --data-parallel 1 replicas x --micro-batches 4: it must "
     "be a multiple of 4; try --batch-size 28\n"),
    ([sys.executable, "examples/mnist/project.py", "docs/traces/trace-large-2x1-1f1b.json",
      "--schedule", "pipedream"],
     "error: unknown schedule 'pipedream': choose one of gpipe, 1f1b, interleaved-1f1b, zb-h1, "
     "zb-v, dualpipe-v\n"),
    ([sys.executable, "examples/mnist/build_memory.py", "own", "x"],
     "error: own x: use whole|own and a stage count P >= 1, e.g. own 2\n"),
    ([sys.executable, "examples/mnist/profile_step.py", "CPU", "--micro-batches", "x"],
     "error: argument --micro-batches: must be a positive integer, got x\n"),
    ([sys.executable, "-m", "pipe", "--stages", "x"],     # argparse's own check, in one line too
     "error: argument --stages: invalid int value: 'x'\n"),
])
def test_benchmark_entry_points_answer_a_bad_value_in_one_line(cmd, message):
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, message)
