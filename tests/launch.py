"""Starting the MNIST example as real processes, and reading back what it saved."""
import json
import os
import subprocess
import sys

import mindspore as ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "mnist", "train.py")
WORKER = os.path.join(ROOT, "tests", "mpi_worker.py")
ENV = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")


def _run(cmd, timeout):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)


def run_example(ranks, *args, timeout=240):
    """`mpiexec -n ranks python train.py args` (no launcher for one rank)."""
    cmd = [sys.executable, TRAIN, *map(str, args)]
    return _run(cmd if ranks == 1 else ["mpiexec", "-n", str(ranks)] + cmd, timeout)


def run_check(script, ranks, *args, timeout=180):
    """`mpiexec -n ranks python tests/<script> args`: a check written against the engine."""
    return _run(["mpiexec", "-n", str(ranks), sys.executable, os.path.join(ROOT, "tests", script),
                 *map(str, args)], timeout)


def run_many(configs, timeout=900):
    """Several (ranks, flags) trainings in one mpiexec launch (see mpi_worker.py)."""
    ranks = max(n for n, _ in configs)
    payload = json.dumps([[n, [str(f) for f in flags]] for n, flags in configs])
    return _run(["mpiexec", "-n", str(ranks), sys.executable, WORKER, payload], timeout)


def load(path):
    return {name: p.asnumpy() for name, p in ms.load_checkpoint(str(path)).items()}
