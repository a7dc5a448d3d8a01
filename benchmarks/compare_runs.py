"""Do two training runs agree? Compares saved weights and the per-step losses they logged.

    python benchmarks/compare_runs.py single/model.ckpt single.log pipe/model.ckpt pipe.log

Exits non-zero unless every parameter matches to rtol 1e-4 and every logged loss to 1e-4.
"""
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from cli import Parser, existing_file, run  # noqa: E402


STEP_LOSS = re.compile(r"step\s+(\d+)\s+(?:length\s+\d+\s+)?loss ([0-9.]+)")  # (not a held-out loss)


def losses(log):
    with open(log) as f:
        return [float(m[2]) for m in STEP_LOSS.finditer(f.read())]


def load(path):
    import mindspore as ms               # (loaded after the flags: a bad one is answered at once)
    try:
        return ms.load_checkpoint(path)
    except ValueError:
        raise ValueError(f"{path} is not a checkpoint MindSpore can load: give the model.ckpt "
                         "that a run's --save wrote") from None


def main(ckpt_a, log_a, ckpt_b, log_b):
    a, b = load(ckpt_a), load(ckpt_b)
    if sorted(a) != sorted(b):
        print(f"different parameters: {sorted(a)} vs {sorted(b)}")
        sys.exit(1)
    worst = max(float(np.max(np.abs(a[k].asnumpy() - b[k].asnumpy()) / (np.abs(a[k].asnumpy()) + 1e-6)))
                for k in a)
    same = all(np.allclose(a[k].asnumpy(), b[k].asnumpy(), rtol=1e-4, atol=1e-6) for k in a)
    la, lb = losses(log_a), losses(log_b)
    curve = len(la) == len(lb) > 0 and np.allclose(la, lb, rtol=1e-4)
    print(f"parameters: {len(a)}, all equal to rtol 1e-4: {same} (largest relative difference {worst:.2e})")
    print(f"losses: {len(la)} vs {len(lb)} steps, equal step for step: {curve}")
    for step, (x, y) in enumerate(zip(la, lb), 1):
        print(f"  step {step:3d}  {x:.6f}  {y:.6f}")
    sys.exit(0 if same and curve else 1)


if __name__ == "__main__":
    parser = Parser(description="Do two training runs agree (weights and logged losses)?")
    for name in ("ckpt_a", "log_a", "ckpt_b", "log_b"):
        parser.add_argument(name, type=existing_file)
    args = parser.parse_args()
    run(lambda: main(args.ckpt_a, args.log_a, args.ckpt_b, args.log_b))
