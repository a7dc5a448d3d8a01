"""How every implementation's step is timed, so that their figures compare (no MindSpore, no
torch: benchmark.py and torch_pipeline.py both import it)."""
import statistics
import time

__all__ = ["median_windows"]


def median_windows(step, warmup, steps, repeats, before=lambda: None):
    """The median time of `step()` in each of `repeats` windows of `steps` calls, after
    `warmup` calls; `before()` runs untimed ahead of every timed call (torch: a barrier)."""
    for _ in range(warmup):
        step()
    medians = []
    for _ in range(repeats):
        times = []
        for _ in range(steps):
            before()
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return medians
