"""What every command-line program of pipe answers to a bad value (one line that names the
value and the fix, exit code 2) and to Ctrl-C (one line on rank 0, exit code 130)."""
import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import fields

from pipe.config import PipelineConfig
from pipe.ops.watchdog import is_alike
from pipe.schedules import SCHEDULES

__all__ = ["as_flags", "Parser", "positive_int", "count", "positive_number", "existing_file", "writable_folder",
           "add_layout_flags", "add_compute_flags",
           "config_from", "use_device", "plan_memory", "run", "precision_name", "report",
           "launch_rank", "PROGRESS", "BUILDING", "stop_on_ctrl_c", "save"]


class Parser(argparse.ArgumentParser):
    def error(self, message):            # (every rank parses the same flags: rank 0 says it)
        if launch_rank() == 0:
            print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def launch_rank():
    """This process's rank as its launcher numbers it (mpiexec, msrun); 0 alone."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MS_NODE_ID", "RANK_ID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def as_flags(message):
    """An error naming config fields (`batch_size=30`) as a program's flags (`--batch-size 30`)."""
    names = sorted((f.name for f in fields(PipelineConfig)), key=len, reverse=True)
    return re.sub(rf"\b({'|'.join(names)})='?([^'\s:;,]*)'?", _flag, message)


def _flag(match):
    """`name=value` as its flag: `--name value`; a switch on or off, `--name` or `--no-name`."""
    flag, value = match.group(1).replace("_", "-"), match.group(2)
    return {"True": f"--{flag}", "False": f"--no-{flag}"}.get(value, f"--{flag} {value}")


def report(error):
    """A refused value in one line, config fields shown as flags; a mistake raised alike on
    every rank said once, by rank 0."""
    if not is_alike(error) or launch_rank() == 0:
        print(f"error: {as_flags(str(error))}", file=sys.stderr, flush=True)


def _checked(text, parse, holds, must):
    """A flag's value parsed, or refused with what it must be and the value given."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not holds(value):
        raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
    return value


def positive_int(text):
    return _checked(text, int, lambda n: n >= 1, "a positive integer")


def count(text):
    """An integer flag that may be 0 (none)."""
    return _checked(text, int, lambda n: n >= 0, "0 or a positive integer")


def positive_number(text):
    return _checked(text, float, lambda x: 0 < x < float("inf"), "a positive finite number")


def writable_folder(text):
    """A folder to save into, made now: a run that cannot write there fails before its first
    step, not at its first checkpoint."""
    try:
        os.makedirs(text, exist_ok=True)
        tempfile.TemporaryFile(dir=text).close()
    except OSError as e:
        why = "a file, not a folder" if isinstance(e, FileExistsError) else e.strerror
        raise argparse.ArgumentTypeError(f"cannot write into {text} ({why}): give a folder "
                                         "you can write") from None
    return text


def existing_file(text):
    """A path flag that must name a file, with the path echoed when it does not."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return text


def add_layout_flags(parser, batch_size):
    """--stages, --data-parallel, --micro-batches, --batch-size (the global mini-batch),
    --schedule."""
    parser.add_argument("--stages", type=positive_int, default=1, help="pipeline stages P")
    parser.add_argument("--data-parallel", type=positive_int, default=1,
                        help="data-parallel replicas D")
    parser.add_argument("--micro-batches", type=positive_int, default=4,
                        help="micro-batches M per replica")
    parser.add_argument("--batch-size", type=positive_int, default=batch_size,
                        help="global mini-batch B")
    parser.add_argument("--schedule", default="1f1b", help=", ".join(SCHEDULES))


def add_compute_flags(parser):
    """How pipe computes: --precision fp32 or fp16 (pipe.features.precision) and --tf32 on
    GPU; --defer-wgrad and --one-graph, with their --no- forms (without, pipe chooses);
    --memory-plan (the default) or --no-memory-plan, use_device's `memory_plan`."""
    parser.add_argument("--precision", type=precision, choices=["fp32", "fp16"], default="fp32",
                        help="fp16: float16 compute and messages, float32 weights, loss scaling")
    parser.add_argument("--tf32", action="store_true",
                        help="GPU: float32 matrix products in TF32 (faster, 10-bit mantissa)")
    parser.add_argument("--defer-wgrad", action=argparse.BooleanOptionalAction, default=None,
                        help="weight gradients once per step over all micro-batches (default: "
                             "pipe chooses)")
    parser.add_argument("--one-graph", action=argparse.BooleanOptionalAction, default=None,
                        help="each step as one compiled graph (default: pipe chooses)")
    parser.add_argument("--memory-plan", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU: plan each graph's device memory when it compiles (MindSpore's "
                             "SOMAS): faster launch-bound steps, in fp16 a larger peak")


def precision(text):
    """--precision's value; bf16 is refused with its reason (it is not among the choices)."""
    if text == "bf16":
        raise argparse.ArgumentTypeError("bf16 is not available: MindSpore 2.10 has no bfloat16 "
                                         "kernels on CPU or GPU; use fp16 or fp32")
    return text


def precision_name(args):
    """How a results row names its precision: fp32, fp32+tf32 or fp16."""
    return args.precision + "+tf32" * args.tf32


def loop_only(parser, args, flag):
    """Refuses `flag` (one that records each action) unless the loop runs: --no-one-graph."""
    if getattr(args, flag[2:].replace("-", "_")) and args.one_graph is not False:
        parser.error(f"{flag} records each action of the loop, and pipe runs one graph unless "
                     "told: add --no-one-graph")


def config_from(args, **settings):
    """The PipelineConfig of parsed `args`: each flag named after a config field sets it;
    `settings` are what the program decides itself."""
    names = {f.name for f in fields(PipelineConfig)}
    given = {name: value for name, value in vars(args).items() if name in names}
    return PipelineConfig(**{**given, **settings})


def use_device(name, memory_plan=True):
    """The device a program runs on, set as MindSpore's and returned ("auto": a GPU where
    nvidia-smi is found, else the CPU); one MindSpore cannot run on is told in one line, exit
    code 2. On a GPU, with `memory_plan`, each graph's memory is planned (plan_memory)."""
    import mindspore as ms
    device = name if name != "auto" else ("GPU" if shutil.which("nvidia-smi") else "CPU")
    if device != "CPU" and not getattr(ms.device_context, device.lower()).is_available():
        print(f"error: --device {device}: this MindSpore cannot run on it here (its {device} "
              "plugin did not load); use --device CPU", file=sys.stderr)
        sys.exit(2)
    ms.set_device(device)
    if device == "GPU" and memory_plan:
        plan_memory()
    return device


def plan_memory():
    """Plan every graph's device memory when it compiles (MindSpore's SOMAS, optimize_level
    "O1"): faster where launches bound the step, same weights. Once per process."""
    import mindspore as ms
    try:
        ms.runtime.set_memory(optimize_level="O1")
    except RuntimeError as e:            # set before (by this, or by the program): that stands
        if "set repeatedly" not in str(e):
            raise


def run(main):
    """Run a program's `main()`, a value the library refuses told in one line; its output
    piped into a reader that stopped early (`| head`) ends it quietly."""
    try:
        main()
    except (ValueError, TypeError) as e:
        report(e)
        sys.exit(2)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # (the exit flushes)
        sys.exit(1)


STARTING = "while starting"
BUILDING = "while building the pipeline"    # from here on the ranks join the launcher's group


class Progress:
    """Where a run is, for what Ctrl-C says: `at` in words; `folders`, the checkpoint folders
    it resumed from or has saved to, in that order."""
    at = STARTING
    folders = ()
    stopping = False


PROGRESS = Progress()
PEER_GRACE = 5.0                         # seconds a rank but 0 gives rank 0 to say its line,
                                         # from building the pipeline on (before, ranks
                                         # have not joined: the launcher waits for each)


def stop_on_ctrl_c():
    """From now on Ctrl-C, which a terminal sends to every process of the job, stops the run
    with exit code 130 (as shells report Ctrl-C): rank 0 says in one line where the run was
    and the last checkpoint sealed, and exits; the other ranks wait for the launcher to end
    them with it (at most PEER_GRACE seconds), so that no peer's exit cuts that line short. No
    traceback, no teardown. A checkpoint being written is dropped, the one before whole
    (pipe.ops.checkpoint). SIGTERM too: inside a compiled call MindSpore turns Ctrl-C into it."""
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)


def _stop(signum=None, frame=None):
    if launch_rank() == 0:
        where = _last_sealed()
        saved = (f"the last checkpoint saved is {where} (--resume {where} continues from it)"
                 if where else "no checkpoint saved")
        print(f"interrupted {PROGRESS.at}; {saved}", file=sys.stderr)
    elif PROGRESS.at != STARTING and not PROGRESS.stopping:     # (a second Ctrl-C: at once)
        PROGRESS.stopping = True         # rank 0 may be inside a compiled call: it speaks when
        time.sleep(PEER_GRACE)           # the call returns, and its exit ends this rank sooner
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)                        # (not exit: MindSpore's threads would be torn down)


def _last_sealed():
    """The newest step folder sealed in the run's checkpoint folders, read from the disk: a
    save cut short names the one before."""
    if not PROGRESS.folders:             # (nothing to read, and MindSpore may be loading)
        return None
    from pipe.ops.checkpoint import newest
    return next(filter(None, map(newest, reversed(PROGRESS.folders))), None)


def save(engine, directory, step, meta=None):
    """`engine.save`, its folder noted for what Ctrl-C says once it holds this run's checkpoint
    (before, its `latest` may name another run's)."""
    where = engine.save(directory, step, meta)
    if directory not in PROGRESS.folders:
        PROGRESS.folders += (directory,)
    return where
