"""Faults turn into prompt, explained failures, and saved work survives them.

All real processes under mpiexec. Nothing here is timed: a fault must be reported for what
it is (a shape check, a deadline naming the lost rank), whatever the machine's load.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from launch import (ENV, LOOP_FLAGS, ROOT, TRAIN, Job, load, load_example, run_check, run_example,
                    run_many)

SMALL = ["--data", "synthetic", "--layers", "3", "--hidden", "32", "--batch-size", "16",
         "--log-every", "1", "--seed", "5"]


SGD = ["--optimizer", "sgd", "--lr", "0.1"]
KILLED = [*SMALL, "--stages", 2, "--steps", 30]       # killed after step 3, then resumed
ADAM_ELSEWHERE = [*SMALL, "--stages", 2, "--data-parallel", 2, "--schedule", "interleaved-1f1b",
                  "--steps", 4]                       # saved on 2 stages, resumed on these
SGD_ELSEWHERE = [*SMALL, *SGD, "--steps", 4, "--stages", 3, "--micro-batches", 2]


def matrix(root):
    """The runs these tests compare with or resume from (in the shared launch:
    conftest.trained): uninterrupted runs, and 2 steps saved (Adam 1F1B; SGD GPipe)."""
    return [(2, [*KILLED, "--save", root / "kill-whole"]),
            (4, [*ADAM_ELSEWHERE, "--save", root / "adam-whole"]),
            (3, [*SGD_ELSEWHERE, "--save", root / "sgd-whole"]),
            (2, [*SMALL, "--stages", 2, "--steps", 2, "--save", root / "saved"]),
            (2, [*SMALL, *SGD, "--stages", 2, "--schedule", "gpipe", "--steps", 2,
                 "--save", root / "saved" / "sgd"])]


def start(ranks, *args):
    return Job(ranks, [sys.executable, TRAIN, *LOOP_FLAGS, *map(str, args)])


def rank_process(job, rank):
    for child in psutil.Process(job.proc.pid).children(recursive=True):
        try:
            if child.environ().get("PMI_RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no process of rank {rank}")


def test_mismatched_stage_shapes_fail_every_rank_before_any_step():
    done = run_check("bad_shapes.py", 2)
    message = ("error: check before the first step failed: stage 1 cannot take stage 0's output "
               "(the boundary between layers 0 and 1), of shape (4, 16) Float32; its first layer "
               "expects 12 features. Fix the model so that layer 0's output fits layer 1's input")
    pointer = ("error: the check before the first step failed on rank 1 (stage 1): rank 1's "
               "error says why")
    assert done.returncode != 0
    assert f"rank 1 {message}" in done.errs[1] and message not in done.errs[0]
    assert pointer in done.errs[0]
    for rank in (0, 1):                   # each learns it from the check, not from a deadline
        assert "no progress" not in done.errs[rank]


def assert_neighbours_name_the_lost_rank(job, timeout):
    """Ranks 0 and 2 of a 3-stage run lost rank 1. The first whose deadline passes says it
    waited `timeout` s on it (a message to or from rank 1, or an all-reduce it is part of)
    and where it was; the other says the same, or, told by the first before its own
    deadline, one line naming that rank and what it waited on."""
    own = {}
    for rank in (0, 2):
        err = job.errs[rank]
        own[rank] = f"error: rank {rank}: no progress for {timeout} s while waiting to " in err
        if not own[rank]:                    # told by the other neighbour
            other = 2 - rank
            assert err.startswith(f"error: rank {rank} stopped waiting to "), err
            assert (f"rank {other} failed (WireTimeout: rank {other}: no progress for {timeout} "
                    "s while waiting to ") in err and f"rank {other}'s error says why" in err, err
            continue
        assert "rank 1\n" in err or "all-reduce over ranks [0, 1, 2]\n" in err
        assert f"rank {rank} (stage {rank}, replica 0) was " in err
        if "was at action" in err:           # inside the schedule: shown in its action list
            assert err.count("<-- HERE") == 1
    assert any(own.values())


def test_rank_that_stops_answering_is_named_by_its_neighbours():
    """SIGSTOP: the rank neither dies nor answers, so the launcher sees nothing; the others'
    own deadlines (--timeout 5) must end the run and say where each one was waiting. (5 s
    leaves a loaded machine's ranks time to reach the first step's checks together.)
    (A killed rank is not tried here: mpiexec ends the whole job itself, whatever pipe does,
    even with -disable-auto-cleanup.)"""
    job = start(3, *SMALL, "--stages", 3, "--steps", 100000, "--timeout", 5)
    job.wait_for_line(0, "step     3")
    rank_process(job, 1).suspend()
    job.wait(timeout=300)
    assert job.returncode != 0
    assert_neighbours_name_the_lost_rank(job, 5)


def test_a_lost_peer_ends_a_run_whose_step_is_one_graph():
    """The same with the step as one compiled graph: rank 0 waits on rank 1 inside the
    graph (a message) or after it (the loss's all-reduce), and says so, and how to see the
    action."""
    job = start(2, *SMALL, "--stages", 2, "--steps", 100000, "--timeout", 5, "--one-graph")
    job.wait_for_line(0, "step     3")
    rank_process(job, 1).suspend()
    job.wait(timeout=300)
    assert job.returncode != 0
    err = job.errs[0]
    assert "error: rank 0: no progress for 5 s while waiting to " in err
    assert ("rank 1\nrank 0 (stage 0, replica 0) was in the step's compiled graph; "
            "--no-one-graph names the action\n") in err or \
        "all-reduce over ranks [0, 1]\nrank 0 (stage 0, replica 0) was in the all-reduce" in err


def test_resume_after_a_kill_gives_the_uninterrupted_weights(trained, tmp_path):
    """The kill lands somewhere after step 3 (checkpoints every step); wherever it lands,
    the resumed run must end with the uninterrupted run's weights."""
    flags = KILLED
    job = start(2, *flags, "--save", tmp_path / "cut", "--save-every", 1)
    job.wait_for_line(0, "step     3")
    os.killpg(job.proc.pid, signal.SIGKILL)
    job.wait(timeout=60)
    resumed = run_example(2, *flags, "--resume", tmp_path / "cut", "--save", tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from step" in resumed.stdout
    got, want = load(tmp_path / "cut" / "model.ckpt"), load(trained / "kill-whole" / "model.ckpt")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


def handles_sigterm(job, rank):
    """Whether rank `rank`'s process has its own SIGTERM handler (the examples' Ctrl-C
    handling, installed before MindSpore loads), from /proc."""
    try:
        with open(f"/proc/{rank_process(job, rank).pid}/status") as f:
            caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
    except (AssertionError, OSError, psutil.Error):
        return False
    return bool(caught & 1 << (signal.SIGTERM - 1))


def both_handle_it(job):
    """As soon as both ranks handle Ctrl-C (their handler installed: MindSpore loading)."""
    return lambda: handles_sigterm(job, 0) and handles_sigterm(job, 1)


def assert_stopped_as_ctrl_c_stops(job):
    """Exit code 130 as mpiexec reports it: rank 0's. mpiexec then kills the ranks that wait
    for it (SIGKILL), and at times reports one of theirs instead, 9: its order of reaping
    them, which machine load moves. Any other code is a failure."""
    assert job.returncode in (130, 9), job.stderr[-2000:]


def ctrl_c(job, ready):
    """SIGINT to the whole job, as a terminal's Ctrl-C, once `ready()`; then its end."""
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert job.proc.poll() is None and time.monotonic() < deadline, "never ready"
        os.killpg(job.proc.pid, signal.SIGINT)
        job.wait(timeout=60)
    finally:
        job.stop()


def left_running(word):
    """The processes still running whose command line holds `word`."""
    left = []
    for p in psutil.process_iter():
        try:
            if word in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except psutil.Error:
            continue
    return left


@pytest.mark.parametrize("after", [None, "step     3"])
def test_ctrl_c_stops_every_rank_in_one_line_with_exit_code_130(tmp_path, after):
    """SIGINT to the whole process group, as a terminal's Ctrl-C: while starting (MindSpore
    loading) or mid-run. Rank 0 says where it stopped and what it saved; no traceback, no
    process left; the checkpoint it names is whole."""
    from pipe.ops.checkpoint import latest
    job = start(2, *SMALL, "--stages", 2, "--steps", 100000, "--save", tmp_path, "--save-every", 1)
    ctrl_c(job, (lambda: job.wait_for_line(0, after) or True) if after else both_handle_it(job))
    assert_stopped_as_ctrl_c_stops(job)
    assert job.errs[1] == "" and "Traceback" not in job.stderr + job.stdout
    assert left_running(str(tmp_path)) == []
    if not after:
        assert job.errs[0] == "interrupted while starting; no checkpoint saved\n"
        return
    where, meta = latest(str(tmp_path))  # (a save cut short: the one before is named)
    stopped = [f"during step {meta['step'] + 1}", f"after step {meta['step']}",
               f"after step {meta['step'] + 1}"]     # (the next one done, its save cut short)
    assert job.errs[0] in [f"interrupted {at} of 100000; the last checkpoint saved is {where} "
                           f"(--resume {where} continues from it)\n" for at in stopped]


def test_ctrl_c_waits_for_rank_0s_line_when_rank_0_is_inside_a_call(tmp_path):
    """Rank 0 inside a call no signal handler interrupts (as a compiled step) when Ctrl-C
    comes: rank 1 waits for rank 0, which says its line once the call returns (if rank 1
    stopped first, the launcher would end rank 0 silently). The call is the run's first save,
    into a folder holding another run's checkpoint: the line names none."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").write_text("step-000099\n")
    job = Job(2, [sys.executable, os.path.join(ROOT, "tests", "ctrl_c_check.py"), str(tmp_path)])
    try:
        job.wait_for_line(0, "ready")
        job.wait_for_line(1, "ready")
        os.killpg(job.proc.pid, signal.SIGINT)
        landed = [tmp_path / f"got-ctrl-c-{rank}" for rank in (0, 1)]
        deadline = time.monotonic() + 60     # (both have their Ctrl-C: only now may rank 0 return)
        while not all(path.stat().st_size for path in landed):
            assert job.proc.poll() is None and time.monotonic() < deadline, job.launcher
            time.sleep(0.01)
        (tmp_path / "release").touch()
        job.wait(timeout=60)
    finally:
        job.stop()
    assert_stopped_as_ctrl_c_stops(job)
    assert job.errs == ["interrupted during step 1 of 1; no checkpoint saved\n", ""]


@pytest.mark.parametrize("script", ["benchmarks/benchmark.py", "benchmarks/gpt_benchmark.py"])
def test_ctrl_c_stops_a_benchmark_launch_while_mindspore_loads(tmp_path, script):
    """The benchmark's programs handle Ctrl-C from their first line, as the examples do: a
    KeyboardInterrupt while MindSpore loads can be swallowed, that rank runs on, and
    ./run_mnist_benchmark.sh waits on it."""
    job = Job(2, [sys.executable, os.path.join(ROOT, script), "--stages", "2", "--micro-batches",
                  "4", "--results", str(tmp_path / "results.jsonl")])
    ctrl_c(job, both_handle_it(job))
    assert_stopped_as_ctrl_c_stops(job)
    assert left_running(str(tmp_path)) == []


def test_ctrl_c_stops_the_benchmark_in_one_line(tmp_path):
    """./run_mnist_benchmark.sh, Ctrl-C once its first launch has started: the launches end
    with it, and it says in one line what it had done; exit code 130."""
    out = open(tmp_path / "out", "w")
    bench = subprocess.Popen(["./run_mnist_benchmark.sh", "--model", "small", "--layout", "2x1",
                              "--schedule", "1f1b", "--out", str(tmp_path / "run")], cwd=ROOT,
                             stdout=out, stderr=subprocess.STDOUT, text=True, env=ENV,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "[1/" not in (tmp_path / "out").read_text():
            assert bench.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        os.killpg(bench.pid, signal.SIGINT)
        assert bench.wait(timeout=60) == 130
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
    said = (tmp_path / "out").read_text().splitlines()
    assert said[-1] == f"interrupted after 1 of 2 launches started; what ended is in " \
                       f"{tmp_path / 'run' / 'results.jsonl'}", said     # (pipe's, then the built-in's)
    assert left_running(str(tmp_path)) == []


@pytest.fixture(scope="module")
def saved(trained):
    """2 steps on 2 stages saved (in the shared launch): (directory, its step directory)
    with Adam (1F1B), and with SGD (GPipe) under `sgd/`."""
    where = trained / "saved"
    with open(where / "latest") as f:
        return where, where / f.read().strip()


@pytest.mark.parametrize("damage", ["truncate", "flip a byte"])
def test_damaged_checkpoint_is_refused(saved, tmp_path, damage):
    import shutil
    where = tmp_path / "copy"
    shutil.copytree(saved[0], where)
    victim = where / saved[1].name / "virtual-stage-1.ckpt"
    blob = victim.read_bytes()
    victim.write_bytes(blob[: len(blob) // 2] if damage == "truncate"
                       else blob[:100] + bytes([blob[100] ^ 1]) + blob[101:])
    done = run_example(2, *SMALL, "--stages", 2, "--steps", 4, "--resume", where)
    assert done.returncode == 2
    assert f"error: checkpoint file '{victim}' is missing, truncated or altered (SHA-256 does not " \
           "match meta.json): refusing to load it" in done.stderr


def test_resume_on_another_layout_equals_an_uninterrupted_run(trained, saved, tmp_path):
    """Saved on 2 stages (1F1B, Adam; GPipe, SGD), resumed at step 2 on another layout and
    schedule: weights and optimizer state are resharded by whole-model name, and the run
    ends where an uninterrupted run of the new layout does."""
    runs = {"adam-resumed": (4, [*ADAM_ELSEWHERE, "--resume", saved[0]]),
            "sgd-resumed": (3, [*SGD_ELSEWHERE, "--resume", saved[0] / "sgd"])}
    done = run_many([(n, flags + ["--save", tmp_path / name]) for name, (n, flags) in runs.items()])
    assert done.returncode == 0, done.stderr[-2000:]
    for optimizer in ("adam", "sgd"):
        got = load(tmp_path / f"{optimizer}-resumed" / "model.ckpt")
        want = load(trained / f"{optimizer}-whole" / "model.ckpt")
        assert sorted(got) == sorted(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6,
                                       err_msg=f"{optimizer} {name}")


def test_a_save_cut_short_leaves_nothing_in_the_next_save_of_its_step(saved, tmp_path):
    """A save of step 4 on 4 stages, cut short (its files, no meta.json), then a run resumed
    on 2 stages saves step 4: only this layout's files are sealed and merged."""
    import shutil
    where = tmp_path / "cut"
    shutil.copytree(saved[0], where, ignore=shutil.ignore_patterns("sgd"))
    (where / "step-000004").mkdir()
    for name in ("virtual-stage-3.ckpt", "optimizer-3.ckpt"):      # (stage 3's, step 2's weights)
        shutil.copy(saved[1] / name.replace("3", "1"), where / "step-000004" / name)
    done = run_example(2, *SMALL, "--stages", 2, "--steps", 4, "--resume", where, "--save", where)
    assert done.returncode == 0, done.stderr[-2000:]
    from pipe.ops.checkpoint import latest
    step, meta = latest(str(where))
    assert sorted(meta["sha256"]) == ["model.ckpt", "optimizer-0.ckpt", "optimizer-1.ckpt",
                                      "virtual-stage-0.ckpt", "virtual-stage-1.ckpt"]
    assert sorted(os.listdir(step)) == sorted([*meta["sha256"], "meta.json"])


def test_a_new_run_saving_where_another_run_saved_keeps_only_its_own_checkpoint(saved, tmp_path):
    """A folder holding another run's steps 2 (the newest, on 2 stages), 3 and 4; a new run
    on 1 stage saves step 2 there: it is sealed with this layout's files alone, `latest`
    names it, and the other run's later steps stay (a save never removes a later step)."""
    import shutil
    where = tmp_path / "reused"
    shutil.copytree(saved[0], where, ignore=shutil.ignore_patterns("sgd"))
    for later in ("step-000003", "step-000004"):
        shutil.copytree(saved[1], where / later)
    done = run_example(1, *SMALL, "--steps", 2, "--save", where)
    assert done.returncode == 0, done.stderr[-2000:]
    from pipe.ops.checkpoint import latest
    step, meta = latest(str(where))
    assert (os.path.basename(step), meta["stages"]) == ("step-000002", 1)
    assert sorted(os.listdir(step)) == ["meta.json", "model.ckpt", "optimizer-0.ckpt",
                                        "virtual-stage-0.ckpt"]
    assert (where / "step-000003").exists() and (where / "step-000004").exists()


def test_an_optimizer_file_holds_its_state_not_the_weights_again(saved):
    """The weights are in the virtual stages' files (and model.ckpt); each stage's optimizer
    file holds Adam's moments and counters alone, a third smaller."""
    import mindspore as ms
    weights = set(ms.load_checkpoint(str(saved[1] / "model.ckpt")))
    for stage in (0, 1):
        names = set(ms.load_checkpoint(str(saved[1] / f"optimizer-{stage}.ckpt")))
        assert "beta1_power" in names and not names & weights, stage
        assert {n for n in names if n.startswith("moment1.")}, stage


def test_a_learning_rate_per_group_resumes_on_each_stage(tmp_path):
    """Stage 0 has two groups, stage 1 one: each stage's `learning_rate_group_0` is its own
    (read from another stage's file, stage 0's matrices went on at 0.01)."""
    done = run_check("resume_check.py", 2, tmp_path / "ckpt", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.outs[0].splitlines()[-1] == ("rank 0: {'learning_rate_group_0': 0.1, "
                                            "'learning_rate_group_1': 0.01} {'learning_rate_group_0'"
                                            ": 0.1, 'learning_rate_group_1': 0.01}")
    assert done.outs[1].splitlines()[-1] == ("rank 1: {'learning_rate_group_0': 0.01} "
                                            "{'learning_rate_group_0': 0.01}")


def test_resume_from_a_step_directory(saved):
    """`--resume` given a step directory (an older one, when the newest is damaged)."""
    done = run_example(2, *SMALL, "--stages", 2, "--steps", 3, "--resume", saved[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resumed from step 2 in {saved[1]}\n" in done.stdout


def test_a_step_directory_whose_save_was_cut_short_is_refused_as_damaged(saved, tmp_path):
    """`--resume ckpt/step-000009`, a save cut short there (no meta.json): told as such,
    not as 'no checkpoint' (no `latest`), which pointed at the wrong fix."""
    import shutil
    from pipe.ops.checkpoint import CheckpointError, latest
    cut = tmp_path / saved[1].name
    shutil.copytree(saved[1], cut)
    (cut / "meta.json").unlink()
    with pytest.raises(CheckpointError) as err:
        latest(str(cut))
    assert str(err.value).startswith(f"checkpoint '{cut}' has no readable meta.json (")
    assert str(err.value).endswith("): it is damaged; resume from an older step directory")


def test_resume_with_another_model_is_refused(saved):
    done = run_example(1, *SMALL, "--hidden", "24", "--steps", 4, "--resume", saved[0])
    assert done.returncode == 2
    assert (f"error: checkpoint '{saved[1]}' holds shape (32, 784) for '0.0.weight', this model "
            "has shape (24, 784): it was saved from another model; resume with the model that "
            "saved it, or start without resuming") in done.stderr


def test_resume_from_nothing_is_refused(tmp_path):
    done = run_example(1, *SMALL, "--steps", 2, "--resume", tmp_path)
    assert done.returncode == 2
    assert f"error: no checkpoint in '{tmp_path}' (no 'latest' file)" in done.stderr


def test_divergence_stops_every_rank_with_the_fix():
    done = run_example(2, *SMALL, "--stages", 2, "--steps", 30, "--optimizer", "sgd", "--lr", "1e30")
    assert done.returncode == 1
    assert all("training diverged; lower the learning rate (--lr)" in err for err in done.errs)


@pytest.mark.parametrize("flag,value,message", [
    ("--micro-batches", "0", "argument --micro-batches: must be a positive integer, got 0"),
    ("--lr", "nan", "argument --lr: must be a positive finite number, got nan"),
    ("--stages", "two", "argument --stages: must be a positive integer, got two"),
    ("--lr", "abc", "argument --lr: must be a positive finite number, got abc"),
    ("--save-every", "-1", "argument --save-every: must be 0 or a positive integer, got -1"),
    ("--precision", "bf16", "argument --precision: bf16 is not available: MindSpore 2.10 has no "
                            "bfloat16 kernels on CPU or GPU; use fp16 or fp32"),
])
def test_bad_flags_are_echoed(flag, value, message, capsys):
    """Answered while parsing, before anything starts (in this process: the example's
    `parse_args`, which its `main` calls first; test_errors.py runs the example itself)."""
    example = load_example("mnist_train", "mnist", "train.py")
    with pytest.raises(SystemExit) as ended:
        example.parse_args([flag, value])
    assert ended.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"      # one line: no usage text


def test_help_lists_only_what_is_accepted(capsys):
    example = load_example("mnist_train", "mnist", "train.py")
    with pytest.raises(SystemExit):
        example.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--precision {fp32,fp16}" in out and "bf16" not in out
