"""pipe.private: with MindSpore's private APIs replaced by their public fallbacks
(PIPE_PUBLIC_ONLY=1, in a process of its own), pipe trains the same weights, bit for bit."""
import os
import subprocess
import sys

import numpy as np

from launch import ENV, ROOT

SCRIPT = os.path.join(ROOT, "tests", "private_check.py")


def test_the_public_fallbacks_train_the_same_weights(tmp_path):
    from private_check import train

    from pipe import private
    assert not private.PUBLIC_ONLY
    out = tmp_path / "public.npz"
    done = subprocess.run([sys.executable, SCRIPT, str(out)], env=dict(ENV, PIPE_PUBLIC_ONLY="1"),
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "private APIs: no"
    public, mine = dict(np.load(out)), train()
    assert sorted(public) == sorted(mine)
    assert all((public[k] == mine[k]).all() for k in mine)
