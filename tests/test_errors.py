"""Usage mistakes fail on every rank, before any message, with the values and the fix."""
import importlib.util
import subprocess
import sys

import pytest
from launch import ENV, ROOT, run_check, run_example

SMALL = ["--layers", "2", "--hidden", "16", "--steps", "1", "--data", "synthetic"]


@pytest.mark.parametrize("ranks,flags,message", [
    (3, ["--stages", 2, "--data-parallel", 2],
     "error: the launcher started 3 processes but --stages 2 x --data-parallel 2 = 4: launch "
     "with -n 4 (mpiexec) or --worker_num=4 (msrun), or change stages and data_parallel so "
     "that their product is 3"),
    (2, ["--stages", 1, "--data-parallel", 2, "--batch-size", 12, "--micro-batches", 4],
     "error: --batch-size 12 cannot be split over --data-parallel 2 replicas x --micro-batches 4: "
     "it must be a multiple of 8; try --batch-size 8"),
    (4, ["--stages", 4, "--layers", 2],
     "error: cannot split 3 layers into --stages 4: every stage needs at least one layer; use "
     "--stages 3 or fewer, or a deeper model"),
    (2, ["--stages", 2, "--schedule", "pipedream"],
     "error: unknown schedule 'pipedream': choose one of gpipe, 1f1b, interleaved-1f1b, zb-h1"),
    (2, ["--stages", 2, "--model", "cnn", "--defer-wgrad", "--timeout", 30],   # batch norm on one stage
     "error: defer_wgrad runs each layer's weight gradient once over the rows of all "
     "micro-batches, which batch norm would normalize by the statistics of them all, not "
     "of each micro-batch; '2.moving_mean' is a parameter not trained, which pipe treats "
     "as batch norm's statistics (it cannot tell a frozen weight from them); turn "
     "defer_wgrad off"),
    (2, ["--stages", 2, "--resume", "nowhere"],
     "error: no checkpoint in 'nowhere' (no 'latest' file): start without resuming, or point it "
     "at a directory that PipelineEngine.save wrote"),
])
def test_mistake_fails_on_every_rank_and_is_told_once(ranks, flags, message):
    """A mistake every rank finds alike ends every rank; rank 0 alone says it, one line."""
    done = run_example(ranks, *SMALL, *flags, timeout=120)
    assert done.returncode != 0
    assert message in done.errs[0]
    assert done.stderr.count("error:") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_a_resume_with_nothing_to_train_says_so_and_how_to_go_on(tmp_path):
    """--steps is the total: resuming a run that reached it trains nothing and says so,
    rather than print an accuracy as if it had trained."""
    saved = run_example(1, *SMALL, "--save", tmp_path, "--no-eval")
    assert saved.returncode == 0, saved.stderr[-2000:]
    done = run_example(1, *SMALL, "--resume", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == (
        f"nothing to train: {tmp_path} holds step 1 and --steps 1 is the total to reach; pass "
        "--steps 2 to train 1 more")


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
    (["./run_mnist_benchmark.sh", "--layout", "9x9"],
     "error: --layout 9x9: P and D run from 1 to 8 (stages x replicas, e.g. 2x1)\n"),
    (["./run_mnist_benchmark.sh", "--layout", "4x1", "--devices", "2"],
     "error: --layout 4x1 needs 4 devices, and there are 2 (CPU): use a layout of at most 2, "
     "or --devices N\n"),
    (["./run_mnist_benchmark.sh", "--precision", "bf16"],
     "error: --precision bf16: MindSpore 2.10 has no bfloat16 kernels on CPU or GPU; use fp16 or "
     "fp32\n"),
    (["./run_mnist_benchmark.sh", "--tf32"],
     "error: --tf32 is an NVIDIA GPU's matrix-product mode, and this machine runs on CPU, which "
     "multiplies in float32 whatever it is set to: drop --tf32\n"),
    (["./run_mnist_benchmark.sh", "--gpt-batch", "100"], "error: --gpt-batch 100: use 64 or 256\n"),
    (["./run_mnist_benchmark.sh", "--model", "small", "--steps"],
     "error: --steps needs a value (see --help)\n"),
    (["./run_mnist_benchmark.sh", "--bogus"], "error: unknown option --bogus (see --help)\n"),
    (["./run_mnist_benchmark.sh", "--model", "small", "--layout", "2x1", "--out", "README.md"],
     "error: --out README.md: cannot make README.md/logs: give a folder you can write\n"),
    (["bash", "benchmarks/gpu_checks.sh", "README.md"],
     "error: README.md: cannot make it: give a folder you can write\n"),
    (["./run_mnist_benchmark.sh", "--gpt-batch", "256"],
     "error: --gpt-batch 256 is for GPUs; on CPU the GPT is scaled down to a batch of 16: drop "
     "--gpt-batch\n"),
    (["bash", "benchmarks/gpu_checks.sh", "/tmp/pipe-gpu-checks", "--model", "bert"],   # (checked before
     "error: --model bert: use mlp or gpt\n"),                                       # it makes the folder)
    (["bash", "benchmarks/gpu_checks.sh", "/tmp/pipe-gpu-checks", "--layout", "1x1"],
     "error: --layout 1x1: use PxD (stages x replicas) of 2 or more GPUs, e.g. 2x2\n"),
    (["bash", "benchmarks/gpu_checks.sh", "/tmp/pipe-gpu-checks", "pipedream"],
     "error: unknown schedule 'pipedream': use one of gpipe 1f1b interleaved-1f1b zb-h1 zb-v dualpipe-v\n"),
    ([sys.executable, "benchmarks/benchmark.py", "--batch-size", "30", "--micro-batches", "4"],
     "error: --batch-size 30 cannot be split over --data-parallel 1 replicas x --micro-batches 4: it must "
     "be a multiple of 4; try --batch-size 28\n"),
    ([sys.executable, "benchmarks/gpt_benchmark.py", "--batch-size", "18", "--micro-batches", "4"],
     "error: --batch-size 18 cannot be split into --micro-batches 4: it must be a multiple of 4; "
     "try --batch-size 16\n"),
    ([sys.executable, "benchmarks/benchmark.py", "--trace", "t"],
     "error: --trace records each action of the loop, and pipe runs one graph unless told: add "
     "--no-one-graph\n"),
    ([sys.executable, "benchmarks/busy.py", "runs/none", "--steps", "5"],
     "error: no gpu_activity_data_*.csv under runs/none: profile on GPUs first (gpt_benchmark.py "
     "--profile DIR, CUPTI's libcupti.so on LD_LIBRARY_PATH)\n"),
    ([sys.executable, "benchmarks/gpt_benchmark.py", "--split"],
     "error: --split records each action of the loop, and pipe runs one graph unless told: add "
     "--no-one-graph\n"),
    ([sys.executable, "benchmarks/benchmark.py", "--turns", "runs/none"],   # (the headline's)
     "error: argument --turns: no such folder: runs/none\n"),
    ([sys.executable, "benchmarks/trace_bubble.py", "runs/none/trace.json"],
     "error: argument trace: no such file: runs/none/trace.json\n"),
    ([sys.executable, "benchmarks/report.py", "runs/none/results.jsonl"],
     "error: argument results: no such file: runs/none/results.jsonl\n"),
    ([sys.executable, "benchmarks/compare_runs.py", "a.ckpt", "a.log", "b.ckpt", "b.log"],
     "error: argument ckpt_a: no such file: a.ckpt\n"),
    ([sys.executable, "benchmarks/compare_runs.py", "README.md", "README.md", "README.md",
      "README.md"], "error: README.md is not a checkpoint MindSpore can load: give the model.ckpt "
                    "that a run's --save wrote\n"),
    ([sys.executable, "examples/mnist/download_dataset.py", "--dir", "README.md"],
     "error: argument --dir: cannot write into README.md (a file, not a folder): give a folder "
     "you can write\n"),
    ([sys.executable, "examples/show_schedule.py", "--stages", "x"],   # argparse's own check too
     "error: argument --stages: invalid int value: 'x'\n"),
    ([sys.executable, "examples/show_schedule.py", "--cost", "1", "-1", "1"],
     "error: argument --cost: must be a positive finite number, got -1\n"),
    ([sys.executable, "examples/mnist/train.py", "--save", "README.md"],   # (not after the run)
     "error: argument --save: cannot write into README.md (a file, not a folder): give a folder "
     "you can write\n"),
    ([sys.executable, "examples/gpt/train.py", "--width", "10"],
     "error: --width 10 must be a multiple of 4: the model splits it into 4 heads\n"),
    ([sys.executable, "examples/gpt/train.py", "--sample", "-1"],
     "error: argument --sample: must be 0 or a positive integer, got -1\n"),
    ([sys.executable, "docs/draw_pipeline.py", "README.md"],
     "error: README.md holds no span of a Chrome trace that pipe recorded: give one that "
     "`benchmarks/benchmark.py --trace STEM` wrote\n"),
    ([sys.executable, "benchmarks/report.py", "README.md"],
     "error: README.md is not the JSON lines a benchmark writes (JSONDecodeError: Expecting value: "
     "line 1 column 1 (char 0)): give the results.jsonl of a benchmark run\n"),
    ([sys.executable, "benchmarks/benchmark.py", "--device", "Ascend"],   # (no Ascend here)
     "error: --device Ascend: this MindSpore cannot run on it here (its Ascend plugin did not load); "
     "use --device CPU\n"),
])
def test_benchmark_entry_points_answer_a_bad_value_in_one_line(cmd, message):
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, message)


@pytest.mark.parametrize("cmd", [["examples/show_schedule.py", "--micro-batches", "64"],
                                 ["examples/mnist/train.py", "--steps", "2", "--data", "synthetic"]])
def test_output_piped_into_a_reader_that_stops_early_ends_without_a_traceback(cmd):
    """`python examples/show_schedule.py | head`: the reader gone before the first line."""
    done = subprocess.Popen([sys.executable, *cmd], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    done.stdout.close()                  # (long before it prints: it is still starting)
    assert (done.wait(timeout=120), done.stderr.read()) == (1, "")


@pytest.mark.parametrize("script", [
    "benchmarks/benchmark.py", "benchmarks/gpt_benchmark.py", "benchmarks/compare_runs.py",
    "examples/mnist/train.py", "examples/gpt/train.py", "examples/merge_checkpoint.py"])
def test_a_bad_flag_is_answered_before_mindspore_loads(script):
    """In a tenth of a second, not the seconds MindSpore takes to import."""
    code = (f"import runpy, sys\nsys.argv = [{script!r}, '--no-such-flag']\n"
            f"try:\n    runpy.run_path({script!r}, run_name='__main__')\n"
            "except SystemExit as e:\n    print(e.code, 'mindspore' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout == "2 False\n"
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1


def gpu_usable():
    import mindspore as ms
    return ms.device_context.gpu.is_available()


@pytest.mark.skipif(gpu_usable(), reason="MindSpore runs on a GPU here")
def test_a_gpu_program_without_a_gpu_says_so_in_one_line():
    """--device GPU asked where MindSpore has no GPU plugin: one line and exit code 2, not
    MindSpore's C++ call stack."""
    done = subprocess.run([sys.executable, "examples/gpt/train.py", "--device", "GPU"], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (
        2, "error: --device GPU: this MindSpore cannot run on it here (its GPU plugin did not load); "
           "use --device CPU\n")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch imports here")
@pytest.mark.parametrize("script", ["benchmarks/torch_gpt.py", "benchmarks/torch_pipeline.py"])
def test_torchs_benchmarks_without_torch_say_so_in_one_line(script):
    """torch is optional (the headline's torch rows appear when it imports); its scripts
    run alone say what is missing, not a traceback."""
    done = subprocess.run([sys.executable, script], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stderr) == (
        2, f"error: torch is not importable: {script} times torch's step; pip install torch\n")


CHECK = "check before the first step failed: "
BUILT_ELSEWHERE = (
    "TypeError: layer builder 1 returned a layer with parameter 'embedding_table', which was made "
    "before the builders ran: a builder makes its layer's weights when called, so build the "
    "layer inside it. A weight shared by two layers (a tied embedding and output head) is given "
    "as pipe.features.builders.Tied(owner, builder): builder(the owner layer) uses its weights")
NO_BACKWARD = "ValueError: 'this layer has no backward'"
UINT16 = ("RuntimeError: " + "check before the first step failed: stage 1 would receive element 1 of "
          "stage 0's output (the boundary between layers 1 and 2) as UInt16, which this wire does not "
          "carry; make layer 1 hand it on as one of Float32, Float16, Float64, Int32, Int64, Bool, "
          "UInt8, Int8, Int16")

OTHER_BATCH = ("batches: rank {}: ValueError: rank 1 passed another batch than rank 0: pipe reads "
               "the inputs on the first stage and the labels on the last, so every rank passes the "
               "same global batch (each replica takes its own rows of it); draw it from one seed "
               "everywhere")


def test_a_model_failing_on_one_rank_fails_every_rank_before_the_first_step():
    """tests/failure_check.py: each case is caught on both ranks, in turn, so none may leave
    a rank waiting. The rank that found the failure says why and where (the layer, the loss,
    the boundary); the other names that rank in one line. Batches that differ between ranks
    are refused alike on both."""
    done = run_check("failure_check.py", 2, "before", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    pointer = "PeerFailed: the check before the first step failed on rank {0} (stage {0}): rank {0}'s error says why"
    assert done.outs[0].splitlines() == [
        "tuple: rank 0: " + pointer.format(1),
        "no-backward-one-graph: rank 0: PeerFailed: rank 1 failed compiling the step as one graph: "
        "rank 1's error says why",
        "uint16: rank 0: " + pointer.format(1),
        "random: rank 0: RuntimeError: " + CHECK + "stage 0 (layers 0 to 1) failed on the input "
        "batch, of shape (2, 8) Float32: layer 1 (HiddenDropout) draws random numbers inside: two "
        "runs of its forward on the same input differ, and pipe's backward runs it again, drawing "
        "others; make each dropout an nn.Dropout layer of its own (pipe draws its mask once per "
        "micro-batch)",
        "targets: rank 0: " + pointer.format(1),
        "tied-builders: rank 0: PeerFailed: rank 1 failed while building its stages: rank 1's "
        "error says why", OTHER_BATCH.format(0)]
    assert done.outs[1].splitlines() == [
        "tuple: rank 1: RuntimeError: " + CHECK + "stage 1 (layers 2 to 3) failed on stage 0's "
        "output (the boundary between layers 1 and 2), of shape (2, 8) Float32: layer 3 (Dense), "
        "given a tuple of 2 (shape (2, 8) Float32, shape (2, 8) Float32), raised TypeError: "
        "Dense.construct() takes 2 positional arguments but 3 were given",
        "no-backward-one-graph: rank 1: " + NO_BACKWARD,
        "uint16: rank 1: " + UINT16,
        "random: rank 1: " + pointer.format(0),
        "targets: rank 1: RuntimeError: " + CHECK + "stage 1 (layer 1) failed on stage 0's output "
        "(the boundary between layers 0 and 1), of shape (2, 8) Float32: loss_fn, given logits of "
        "shape (2, 3) Float32 and labels of shape (2,) Float32, raised TypeError: For "
        "primitive[SparseSoftmaxCrossEntropyWithLogits], the input argument[labels_type] must be a "
        "type of {Tensor[Int32], Tensor[Int64]}, but got Tensor[Float32].",
        "tied-builders: rank 1: " + BUILT_ELSEWHERE, OTHER_BATCH.format(1)]


def test_a_mistake_every_rank_makes_is_printed_once_uncaught():
    """Each rank passes its own batch and nobody catches the refusal: rank 0 prints it, the
    other rank, which raised the same, ends quietly."""
    done = run_check("failure_check.py", 2, "batches", timeout=120)
    assert done.returncode != 0
    said = [line for err in done.errs for line in err.splitlines() if "another batch" in line]
    assert said == ["ValueError: " + OTHER_BATCH.format(0).split(": ", 3)[3]]
    assert "another batch" in done.errs[0]


def test_a_backward_failing_mid_step_ends_every_rank_at_once():
    """Rank 1's first backward raises and nobody catches it: the job ends within seconds
    (the deadline is 300 s; the launch is killed, and the test fails, after 120), rank 1
    printing its error and where it was, rank 0 one line naming rank 1."""
    done = run_check("failure_check.py", 2, "during", timeout=120)
    assert done.returncode != 0
    assert done.errs[0] == ("error: rank 0 stopped waiting to send (tag 6) to rank 1: rank 1 "
                            "failed (ValueError: 'this layer has no backward'); rank 1's error "
                            "says why\n")
    assert "ValueError: 'this layer has no backward'" in done.errs[1]
    assert "rank 1 (stage 1, replica 0) was at action 2 (B0) of its 1f1b schedule" in done.errs[1]
    assert done.stdout == ""
