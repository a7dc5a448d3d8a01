"""Starting real processes for the tests, and reading back what each rank wrote.

Every rank's stdout and stderr go to files of their own (mpiexec's -outfile-pattern), so
two ranks' lines can never merge into one: a test reads `job.outs[rank]` / `job.errs[rank]`.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import mindspore as ms
import psutil

from pipe.config import PipelineConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "mnist", "train.py")
WORKER = os.path.join(ROOT, "tests", "mpi_worker.py")
ENV = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")


class Job:
    """`mpiexec -n ranks cmd` (the bare command for one rank), started at once.

    After `wait()`, `outs[r]` and `errs[r]` hold rank r's output; `stdout` / `stderr` join
    them in rank order (the launcher's own messages last)."""

    def __init__(self, ranks, cmd):
        self.ranks, self.logs = ranks, tempfile.mkdtemp(prefix="pipe-test-")
        if ranks > 1:
            cmd = ["mpiexec", "-n", str(ranks),
                   "-outfile-pattern", self._path("out.%r"),
                   "-errfile-pattern", self._path("err.%r"), *cmd]
            names = ("launcher", "launcher")           # what mpiexec itself prints
        else:
            names = ("out.0", "err.0")
        with open(self._path(names[0]), "a") as out, open(self._path(names[1]), "a") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=ENV,
                                         cwd=ROOT, start_new_session=True)
        self.outs = self.errs = None
        self.launcher = ""

    def _path(self, name):
        return os.path.join(self.logs, name)

    def _read(self, name):
        try:
            with open(self._path(name)) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def out_so_far(self, rank):
        return self._read(f"out.{rank}")

    def wait_for_line(self, rank, prefix, limit=300):
        """Block until rank `rank` has printed a line starting with `prefix`."""
        deadline = time.monotonic() + limit
        while not any(line.startswith(prefix) for line in self.out_so_far(rank).splitlines()):
            if self.proc.poll() is not None:
                self.wait(0)
                raise AssertionError(f"the job ended before rank {rank} printed {prefix!r}:\n"
                                     f"{self.stderr[-3000:]}")
            assert time.monotonic() < deadline, f"rank {rank} printed no {prefix!r} in {limit} s"
            time.sleep(0.1)

    def wait(self, timeout):
        """Wait for the job to end (it is killed after `timeout` s), then read its output."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        finally:
            self.outs = [self._read(f"out.{r}") for r in range(self.ranks)]
            self.errs = [self._read(f"err.{r}") for r in range(self.ranks)]
            self.launcher = self._read("launcher")
            shutil.rmtree(self.logs, ignore_errors=True)
        return self

    def stop(self):
        """End the job if it still runs (a session that ended before waiting for it)."""
        if self.proc.poll() is None:
            self.kill()
        shutil.rmtree(self.logs, ignore_errors=True)

    def kill(self):
        """Every process of the job: mpiexec's group, and the ranks, which its proxy starts in
        sessions of their own."""
        try:
            ranks = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            ranks = []
        os.killpg(self.proc.pid, 9)
        for rank in ranks:
            try:
                rank.kill()
            except psutil.Error:
                pass
        self.proc.wait()

    @property
    def returncode(self):
        return self.proc.returncode

    @property
    def stdout(self):
        return "".join(self.outs)

    @property
    def stderr(self):
        return "".join(self.errs) + self.launcher


# The example's flags for the per-action loop with W per micro-batch, put before a test's
# own (the last of --one-graph / --no-one-graph wins): what pipe chooses is tests/test_modes.py's.
LOOP_FLAGS = ["--no-one-graph", "--no-defer-wgrad"]


def run_example(ranks, *args, timeout=300):
    """`mpiexec -n ranks python train.py args` (no launcher for one rank), to its end."""
    return Job(ranks, [sys.executable, TRAIN, *LOOP_FLAGS, *map(str, args)]).wait(timeout)


def run_check(script, ranks, *args, timeout=300):
    """`mpiexec -n ranks python tests/<script> args`: a check written against the engine."""
    return Job(ranks, [sys.executable, os.path.join(ROOT, "tests", script), *map(str, args)]).wait(timeout)


def start_many(configs, world=1, ended=None):
    """Several (ranks, flags or mlp_run spec) trainings in one mpiexec launch (mpi_worker.py),
    of at least `world` ranks (more side by side keep the cores busy while some wait), started.
    `ended`: a directory where the file named i appears once configuration i has ended well."""
    ranks = max(world, *(n for n, _ in configs))
    payload = json.dumps([[n, [str(f) for f in flags] if isinstance(flags, list) else flags]
                          for n, flags in configs], default=str)
    return Job(ranks, [sys.executable, WORKER, payload, *([str(ended)] if ended else [])])


def run_many(configs, timeout=900, world=1):
    """`start_many`, to its end."""
    return start_many(configs, world).wait(timeout)


def load_example(name, *path):
    """A module of examples/ by its path (`"gpt", "model.py"`), under `name`: `model` and
    `train` are names several examples use, and one launch runs them all. Registered in
    sys.modules, where MindSpore's compiler looks for a layer's module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", *path))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(path):
    return {name: p.asnumpy() for name, p in ms.load_checkpoint(str(path)).items()}


def results(directory):
    """{rank: what train() returned there} for a run_many configuration saved in `directory`."""
    found = {}
    for name in os.listdir(directory):
        if name.startswith("result-rank"):
            with open(os.path.join(directory, name)) as f:
                found[int(name[len("result-rank"):-len(".json")])] = json.load(f)
    return dict(sorted(found.items()))


def assert_same_bits(got, want):
    """Two runs' {name: value} (`load`): the same names, every value bit for bit."""
    assert sorted(got) == sorted(want) and all((got[k] == want[k]).all() for k in want)


def assert_like_one_process(directory, weights, losses, atol=2e-5, rtol=1e-5):
    """The run saved in `directory` (its model.ckpt, every rank's results) against one
    process's `weights` ({name: value}) and `losses`; returns the ranks' results."""
    import numpy as np
    saved = load(os.path.join(directory, "model.ckpt"))
    assert sorted(saved) == sorted(weights)
    worst = max(float(np.abs(saved[n] - weights[n]).max()) for n in weights)
    assert worst < atol, f"{directory}: weights differ from one process by {worst}"
    ranks = results(directory)
    for rank, result in ranks.items():
        np.testing.assert_allclose(result["losses"], losses, rtol=rtol, err_msg=f"rank {rank}")
    return ranks


def loop_config(**fields):
    """A PipelineConfig with the per-action loop and W per micro-batch unless `fields` say
    otherwise: what each feature's tests pin (tests/test_modes.py: what pipe chooses)."""
    return PipelineConfig(**{"defer_wgrad": False, "one_graph": False, **fields})
