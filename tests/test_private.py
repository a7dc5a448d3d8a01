"""pipe.private: with MindSpore's private APIs replaced by their public fallbacks
(PIPE_PUBLIC_ONLY=1), pipe trains the same weights, bit for bit, in the loop and as one graph."""
import os
import subprocess
import sys

import numpy as np
from launch import ENV, ROOT

SCRIPT = os.path.join(ROOT, "tests", "private_check.py")


def test_the_public_fallbacks_train_the_same_weights(tmp_path):
    runs = {}
    for public in ("0", "1"):
        out = tmp_path / f"public-{public}.npz"
        done = subprocess.run([sys.executable, SCRIPT, str(out)], env=dict(ENV, PIPE_PUBLIC_ONLY=public),
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.splitlines()[-1] == f"private APIs: {'no' if public == '1' else 'yes'}"
        runs[public] = dict(np.load(out))
    assert sorted(runs["0"]) == sorted(runs["1"])
    assert all((runs["0"][k] == runs["1"][k]).all() for k in runs["0"])
