"""Faults turn into prompt, explained failures, and saved work survives them.

All real processes under mpiexec. Timings asserted here are deadlines, not speeds.
"""
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from launch import ENV, ROOT, TRAIN, load, run_check, run_example

SMALL = ["--data", "synthetic", "--layers", "3", "--hidden", "32", "--batch-size", "16",
         "--log-every", "1", "--seed", "5"]


def start(ranks, *args):
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, TRAIN, *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, cwd=ROOT, start_new_session=True)


def wait_for_line(proc, prefix, limit=120):
    deadline = time.monotonic() + limit
    for line in proc.stdout:
        if line.startswith(prefix):
            return
        assert time.monotonic() < deadline, f"no line {prefix!r} within {limit} s"
    raise AssertionError(f"process ended before printing {prefix!r}: {proc.stderr.read()[-2000:]}")


def rank_process(proc, rank):
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.environ().get("PMI_RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no process of rank {rank}")


def test_mismatched_stage_shapes_fail_every_rank_quickly():
    begin = time.monotonic()
    done = run_check("bad_shapes.py", 2, timeout=60)
    elapsed = time.monotonic() - begin
    print(f"shape mismatch: all ranks exited after {elapsed:.1f} s")
    message = ("error: shape check failed before the first step: stage 1 cannot take the activation "
               "of shape (4, 16) Float32 that stage 0 sends across the boundary between layers 0 "
               "and 1; its first layer expects 12 features. Fix the model so that layer 0's output "
               "fits layer 1's input")
    assert done.returncode != 0 and elapsed < 30
    assert f"rank 0 {message}" in done.stderr and f"rank 1 {message}" in done.stderr


def test_killed_rank_stops_every_other_rank_within_the_deadline():
    proc = start(3, *SMALL, "--stages", 3, "--steps", 100000, "--timeout", 15)
    wait_for_line(proc, "step     3")
    rank_process(proc, 1).kill()                       # SIGKILL, mid-run
    killed = time.monotonic()
    proc.wait(timeout=60)
    print(f"killed rank 1: the others exited {time.monotonic() - killed:.1f} s later, code {proc.returncode}")
    assert proc.returncode != 0
    assert time.monotonic() - killed < 15 + 10


def test_rank_that_stops_answering_is_named_within_the_deadline():
    """SIGSTOP: the rank neither dies nor answers, so the launcher sees nothing; the others'
    own deadlines (--timeout 5) must end the run and say where each one was waiting."""
    proc = start(3, *SMALL, "--stages", 3, "--steps", 100000, "--timeout", 5)
    wait_for_line(proc, "step     3")
    rank_process(proc, 1).suspend()
    stopped = time.monotonic()
    proc.wait(timeout=60)
    elapsed = time.monotonic() - stopped
    print(f"stopped rank 1: the run ended {elapsed:.1f} s later, code {proc.returncode}")
    err = proc.stderr.read()
    assert proc.returncode != 0 and elapsed < 5 + 10
    for rank in (0, 2):                 # both neighbours name rank 1 and where they were
        assert f"error: rank {rank}: no progress for 5 s while waiting to " in err
        assert f"rank {rank} (stage {rank}, replica 0) was at action" in err
    assert err.count("rank 1\n") == 2 and err.count("<-- HERE") == 2


def test_resume_after_a_kill_gives_the_uninterrupted_weights(tmp_path):
    flags = [*SMALL, "--stages", 2, "--steps", 8]
    whole = run_example(2, *flags, "--save", tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    kill_at = random.randint(2, 6)
    print(f"killing at step {kill_at}")
    proc = start(2, *flags, "--save", tmp_path / "cut", "--save-every", 1)
    wait_for_line(proc, f"step {kill_at:5d}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    resumed = run_example(2, *flags, "--resume", tmp_path / "cut", "--save", tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from step" in resumed.stdout
    got, want = load(tmp_path / "cut" / "model.ckpt"), load(tmp_path / "whole" / "model.ckpt")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    where = tmp_path_factory.mktemp("saved")
    done = run_example(2, *SMALL, "--stages", 2, "--steps", 2, "--save", where)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(where / "latest") as f:
        return where, where / f.read().strip()


@pytest.mark.parametrize("damage", ["truncate", "flip a byte"])
def test_damaged_checkpoint_is_refused(saved, tmp_path, damage):
    import shutil
    where = tmp_path / "copy"
    shutil.copytree(saved[0], where)
    victim = where / saved[1].name / "stage-1.ckpt"
    blob = victim.read_bytes()
    victim.write_bytes(blob[: len(blob) // 2] if damage == "truncate"
                       else blob[:100] + bytes([blob[100] ^ 1]) + blob[101:])
    done = run_example(2, *SMALL, "--stages", 2, "--steps", 4, "--resume", where)
    assert done.returncode == 2
    assert f"error: checkpoint file '{victim}' is missing, truncated or altered (SHA-256 does not " \
           "match meta.json): refusing to load it" in done.stderr


def test_resume_with_another_layout_is_refused(saved):
    done = run_example(1, *SMALL, "--steps", 4, "--resume", saved[0])
    assert done.returncode == 2
    assert "was saved with {'stages': 2, 'data_parallel': 1, 'schedule': '1f1b', 'virtual_stages': " \
           "1, 'bounds': [[0, 2], [2, 4]]}, this run is {'stages': 1," in done.stderr
    assert "resume with the same --stages/--dp/--schedule/--virtual-stages/--partition" in done.stderr


def test_resume_from_nothing_is_refused(tmp_path):
    done = run_example(1, *SMALL, "--steps", 2, "--resume", tmp_path)
    assert done.returncode == 2
    assert f"error: no checkpoint in '{tmp_path}' (no 'latest' file)" in done.stderr


def test_divergence_stops_every_rank_with_the_fix():
    done = run_example(2, *SMALL, "--stages", 2, "--steps", 30, "--optimizer", "sgd", "--lr", "1e30")
    assert done.returncode == 1
    assert done.stderr.count("training diverged; lower the learning rate (--lr)") == 2


@pytest.mark.parametrize("flag,value,message", [
    ("--micro-batches", "0", "argument --micro-batches: must be a positive integer, got 0"),
    ("--lr", "nan", "argument --lr: must be a positive finite number, got nan"),
    ("--stages", "two", "argument --stages: invalid _count value: 'two'"),
    ("--save-every", "-1", "--steps (300) and --save-every (-1) cannot be negative"),
])
def test_bad_flags_are_echoed(flag, value, message):
    done = run_example(1, flag, value)
    assert done.returncode == 2 and message in done.stderr
