"""Per-stage checkpoints, and merging them into one checkpoint of the whole model.

Each stage (data-parallel replica 0) writes `DIR/stage-<s>.ckpt` with its parameters under
their names in the unpartitioned model. Merging them gives `DIR/model.ckpt`, a plain
MindSpore checkpoint that `mindspore.load_checkpoint` loads into that model:

    python -m pipe.checkpoint merge DIR

Files are written under a temporary name and renamed into place, so a crash mid-write
never leaves a half-written file where a good one was.
"""
import argparse
import glob
import os

import mindspore as ms

__all__ = ["save_stage", "merge", "stage_path"]


def stage_path(directory, stage):
    return os.path.join(directory, f"stage-{stage}.ckpt")


def _save_atomically(entries, path):
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.getpid()}-{os.path.basename(path)}")
    ms.save_checkpoint(entries, tmp)
    os.replace(tmp, path)


def save_stage(directory, stage, names, params):
    """Write one stage's parameters under their whole-model names."""
    os.makedirs(directory, exist_ok=True)
    _save_atomically([{"name": n, "data": p} for n, p in zip(names, params)],
                     stage_path(directory, stage))


def merge(directory):
    """Combine every `stage-<s>.ckpt` in `directory` into `directory/model.ckpt`."""
    paths = sorted(glob.glob(os.path.join(directory, "stage-*.ckpt")),
                   key=lambda p: int(os.path.basename(p)[6:-5]))
    if not paths:
        raise FileNotFoundError(f"no stage-<s>.ckpt files in {directory!r}: save the pipeline "
                                "there first (--save DIR)")
    entries = []
    for path in paths:
        entries += [{"name": name, "data": p} for name, p in ms.load_checkpoint(path).items()]
    out = os.path.join(directory, "model.ckpt")
    _save_atomically(entries, out)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m pipe.checkpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["merge"])
    parser.add_argument("directory")
    args = parser.parse_args(argv)
    print(f"wrote {merge(args.directory)}")


if __name__ == "__main__":
    main()
