"""Runs several training configurations inside one `mpiexec` launch.

    mpiexec -n 4 python tests/mpi_worker.py '[[2, ["--stages", "2", "--save", "/tmp/a"]], ...]'

A configuration is the example's flags (a list: examples/mnist/train.py) or a dict for
tests/mlp_run.py (with "model": "gpt" or "gpt-example", tests/gpt_run.py; "predict",
"tied": tests/<model>_check.py), which drives the engine directly.

Starting MindSpore once per process instead of once per configuration keeps the
equivalence matrices within CI's time. Configurations that fit side by side run at once,
each on its own ranks (an MPI sub-communicator): a pipeline waiting on its own stages
leaves the CPU to another. Each rank of a configuration with --save DIR writes what it
returned (every step's loss, peak activation memory), the SHA-256 of each buffer it holds
(batch norm's moving statistics) and the CPU time the configuration took there
(tests/cpu_report.py) to DIR/result-rank<r>.json. Given a second
argument, a directory, each configuration's first rank writes a file named for its place in
the list there once all its ranks have ended well: a test can read its runs while the launch
goes on with the others'.
"""
import hashlib
import json
import os
import sys
import time
import traceback

from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "mnist"))
import dtypes_run  # noqa: E402
import gpt_run  # noqa: E402
import mlp_run  # noqa: E402
import predict_check  # noqa: E402
import tied_check  # noqa: E402
import train  # noqa: E402
from launch import LOOP_FLAGS  # noqa: E402

from pipe.ops.deadlines import DeadlineWire  # noqa: E402


def waves(configs, world):
    """Configurations grouped so that each group fits in `world` ranks at once (first fit,
    in the given order): [[(first rank, ranks, index in `configs`), ...], ...]."""
    pending, out = list(range(len(configs))), []
    while pending:
        wave, free = [], world
        for index in list(pending):
            ranks = configs[index][0]
            if ranks <= free:
                wave.append((world - free, ranks, index))
                free -= ranks
                pending.remove(index)
        out.append(wave)
    return out


def wait_all(communicator):
    """A barrier that sleeps while it waits: idle ranks leave the 2 CI cores to the others."""
    done = communicator.Ibarrier()
    while not done.Test():
        time.sleep(0.01)


def run(flags, communicator):
    started = time.process_time()        # (this process's CPU time: tests/cpu_report.py)
    if isinstance(flags, dict):
        run_spec = {"gpt": gpt_run.pipe_run, "gpt-example": gpt_run.example_run,
                    "dtypes": dtypes_run.pipe_run,
                    "predict": predict_check.pipe_run,
                    "tied": tied_check.pipe_run}.get(flags.get("model"), mlp_run.pipe_run)
        engine, result = run_spec(flags, communicator)
        save = flags["save"]
    else:
        args = train.parse_args(LOOP_FLAGS + flags)
        result, save = train.train(args, DeadlineWire(120.0, communicator)), args.save
        engine = result.pop("engine")
    result["buffers"] = {b.name: hashlib.sha256(b.asnumpy().tobytes()).hexdigest()
                         for b in engine.layout.buffers}
    result["cpu_seconds"] = time.process_time() - started
    if save:
        os.makedirs(save, exist_ok=True)
        with open(os.path.join(save, f"result-rank{communicator.Get_rank()}.json"), "w") as f:
            json.dump(result, f)


world = MPI.COMM_WORLD
me = world.Get_rank()
configs, ended = json.loads(sys.argv[1]), (sys.argv[2:] or [None])[0]
for wave in waves(configs, world.Get_size()):
    mine = [(first, index) for first, ranks, index in wave if first <= me < first + ranks]
    sub = world.Split(mine[0][0] if mine else MPI.UNDEFINED, me)
    if mine:
        try:
            run(configs[mine[0][1]][1], sub)
        except BaseException:            # end the whole launch now: ranks of other
            traceback.print_exc()        # configurations would wait for this one forever
            sys.stderr.flush()
            world.Abort(1)
        wait_all(sub)
        if ended and sub.Get_rank() == 0:
            open(os.path.join(ended, str(mine[0][1])), "w").close()
        sub.Free()
    wait_all(world)
