"""Each rank's device busy time per step, from MindSpore's profiler on GPUs
(`gpt_benchmark.py --profile DIR`, or `benchmark.py --profile DIR`: DIR/SCHEDULE): the time
of its kernels as CUPTI measured them, NCCL's apart (a Receive's kernel runs while it waits
for the peer), over the profiled steps (--steps).

    python benchmarks/busy.py DIR --steps 5

One line per rank. Set beside the same layers' step alone on one GPU, it says whether a
stage computes as fast pipelined as alone: the rest of the step is the bubble and waiting.
"""
import csv
import glob
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from cli import Parser, positive_int  # noqa: E402


def kernel_times(path):
    """(compute, NCCL) microseconds and the compute kernels' count in one rank's
    gpu_activity_data file (one row per kernel: its occurrences and total duration)."""
    compute = nccl = count = 0.0
    with open(path) as f:
        for row in csv.DictReader(f):
            spent = float(row["total_duration(us)"])
            if "nccl" in row["name"].lower():
                nccl += spent
            else:
                compute, count = compute + spent, count + int(row["occurrences"])
    return compute, nccl, count


def activity_files(folder):
    """{rank: its gpu_activity_data file} under `folder`, by rank."""
    files = glob.glob(os.path.join(folder, "**", "gpu_activity_data_*.csv"), recursive=True)
    return dict(sorted((int(re.search(r"_(\d+)\.csv$", path)[1]), path) for path in files))


def main(files, steps):
    for rank, path in files.items():
        compute, nccl, count = kernel_times(path)
        print(f"rank {rank}: kernels {compute / 1e3 / steps:.1f} ms a step ({count / steps:.0f} "
              f"of them), NCCL's {nccl / 1e3 / steps:.1f} ms", flush=True)


if __name__ == "__main__":
    parser = Parser(description="Each rank's device busy time per step, from gpt_benchmark.py "
                                "--profile")
    parser.add_argument("folder", help="--profile's folder")
    parser.add_argument("--steps", type=positive_int, required=True, help="the profiled steps")
    args = parser.parse_args()
    files = activity_files(args.folder)
    if not files:
        parser.error(f"no gpu_activity_data_*.csv under {args.folder}: profile on GPUs first "
                     "(gpt_benchmark.py --profile DIR, CUPTI's libcupti.so on LD_LIBRARY_PATH)")
    main(files, args.steps)
