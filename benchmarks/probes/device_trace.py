"""What the GPU did during a few training steps: per step, the kernels it ran, how long it
was busy, and which kernels took the time (MindSpore's profiler, over CUPTI).

    python benchmarks/probes/device_trace.py DIR STEPS   # summarize a trace that trace() wrote

Busy time far below the step time means the step is bound by the host issuing kernels,
not by the GPU: the small MLP's one-device step was (docs/performance.md, "One H200").

`trace(step, steps, directory)` runs `step()` (which must wait for its step) `steps` times
under the profiler, 0.3 s apart: the longest idle stretches of the device cut the steps. MindSpore 2.10
loads libcupti.so from LD_LIBRARY_PATH; the GPU kit has none: the nvidia-cuda-cupti-cu11
11.8.87 wheel's nvidia/cuda_cupti/lib/libcupti.so.11.8, renamed libcupti.so, works.
"""
import collections
import glob
import itertools
import os
import sys
import time

PAUSE_S = 0.3           # between traced steps (the profiler slows a step's host 5-10x)


def trace(step, steps, directory):
    import mindspore as ms
    from mindspore.profiler import ProfilerActivity
    profiler = ms.Profiler(output_path=directory,
                           activities=[ProfilerActivity.CPU, ProfilerActivity.GPU])
    profiler.start()
    for _ in range(steps):
        step()
        time.sleep(PAUSE_S)
    profiler.stop()
    profiler.analyse()               # (also what lets a later Profiler in this process start)


def kernels(directory):
    """[(start ns, duration ns, kernel name)] recorded under `directory`, by start."""
    found = []
    for path in glob.glob(os.path.join(directory, "**", "activity_execute_timestamp_*.txt"),
                          recursive=True):
        with open(path) as f:
            for line in f:
                name, _stream, start, duration_us = line.rstrip("\n").rsplit(";", 3)
                found.append((int(start), round(float(duration_us) * 1e3), name.split("(")[0]))
    return sorted(found)


def steps_of(found, steps):
    """The kernels cut into `steps` steps at the device's longest idle stretches."""
    ends = list(itertools.accumulate((s + d for s, d, _ in found), max))
    idle = sorted(range(1, len(found)), key=lambda i: found[i][0] - ends[i - 1])
    cuts = sorted(idle[len(idle) - steps + 1:]) if steps > 1 else []
    return [found[a:b] for a, b in zip([0] + cuts, cuts + [len(found)])]


def summary(directory, steps, top=12):
    """Lines: each of the `steps` traced steps' kernels, busy and span microseconds; the
    middle step's costliest kernels."""
    found = kernels(directory)
    if not found:
        return [f"no kernels under {directory} (is libcupti.so on LD_LIBRARY_PATH?)"]
    steps, lines = steps_of(found, steps), []
    for i, step in enumerate(steps):
        busy = sum(d for _, d, _ in step) / 1e3
        span = (max(s + d for s, d, _ in step) - step[0][0]) / 1e3
        lines.append(f"step {i}: {len(step)} kernels, busy {busy:.0f} us, span {span:.0f} us")
    count, spent = collections.Counter(), collections.Counter()
    for _, duration, name in steps[len(steps) // 2]:
        count[name] += 1
        spent[name] += duration
    lines.append(f"step {len(steps) // 2}, its kernels by time:")
    lines += [f"  {count[name]:4d} x {spent[name] / 1e3:9.1f} us  {name[:90]}"
              for name, _ in spent.most_common(top)]
    return lines


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[0]) or not argv[1].isdigit() or argv[1] == "0":
        print(f"usage: python {sys.argv[0]} DIR STEPS (a directory trace() wrote, and how many "
              "steps it traced)", file=sys.stderr)
        return 2
    print("\n".join(summary(argv[0], int(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
