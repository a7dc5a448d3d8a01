"""Checkpoints that survive crashes, and their merge into one checkpoint of the whole model.

    DIR/step-000040/virtual-stage-<v>.ckpt  each virtual stage's parameters, by whole-model name
    DIR/step-000040/optimizer-<s>.ckpt      each stage's optimizer state
    DIR/step-000040/model.ckpt              the stages merged: loads into the unsplit model
    DIR/step-000040/meta.json               step, layout, the caller's meta, every file's SHA-256
    DIR/latest, DIR/model.ckpt              the newest complete step, and its merged model

Each file is written under a temporary name and renamed, meta.json last, then `latest`: a
crash leaves the previous checkpoint whole, and an altered file is refused by its hash."""
import glob
import hashlib
import json
import os
import shutil
from pathlib import Path

import mindspore as ms


__all__ = ["step_dir", "save_params", "save_rank", "load_params", "load_rank", "clear", "finish",
           "newest", "latest", "merge", "CheckpointError"]


VIRTUAL_STAGE = "virtual-stage-"      # a virtual stage's file: virtual-stage-<v>.ckpt
STEP = "step-"                        # a step's folder: step-<6 digits>


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, damaged, or from a different run layout."""


def step_dir(directory, step):
    return os.path.join(directory, f"{STEP}{step:06d}")


def _atomic(path, write):
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.getpid()}-{os.path.basename(path)}")
    write(tmp)
    os.replace(tmp, path)


def _write_text(path, text):
    _atomic(path, lambda tmp: Path(tmp).write_text(text))


def virtual_stage_file(where, virtual_stage):
    """A virtual stage's parameters and buffers, by whole-model name."""
    return os.path.join(where, f"{VIRTUAL_STAGE}{virtual_stage}.ckpt")


def optimizer_file(where, stage):
    """A pipeline stage's optimizer state (replica 0 writes it; replicas hold the same)."""
    return os.path.join(where, f"optimizer-{stage}.ckpt")


def save_params(path, named):
    """Write [(name, Parameter or Tensor)] as a MindSpore checkpoint, atomically; none, no file
    (a chunk of pooling and activations, a stage's optimizer without weights)."""
    named = list(named)
    if not named:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _atomic(path, lambda tmp: ms.save_checkpoint([{"name": n, "data": p} for n, p in named], tmp))


def save_rank(where, layout, optimizer):
    """This rank's files: each chunk's parameters and buffers, and its optimizer's state but
    the weights (replica 0 only: the replicas hold the same)."""
    if layout.replica:
        return
    for vs, chunk, names in zip(layout.virtual_stages_held, layout.chunks, layout.names):
        save_params(virtual_stage_file(where, vs), zip(names, chunk.state))
    weights = {id(p) for p in layout.params}        # (in the virtual stages' files: not again)
    save_params(optimizer_file(where, layout.stage),
                [(n, p) for n, p in optimizer.parameters_and_names() if id(p) not in weights])


def load_params(params, saved, source, fix):
    """Set each of `params` ({whole-model name: Parameter}) from `saved`; a missing name or
    another shape is refused with `fix`."""
    for name, p in params.items():
        if name not in saved or tuple(saved[name].shape) != tuple(p.shape):
            found = f"shape {tuple(saved[name].shape)}" if name in saved else "nothing"
            raise CheckpointError(f"{source} holds {found} for '{name}', this model has shape "
                                  f"{tuple(p.shape)}: it was saved from another model; {fix}")
        p.set_data(saved[name])


def load_rank(where, params, optimizer, stage):
    """Load this rank's share of the checkpoint in `where`, whatever layout saved it: the
    parameters from the merged model, the optimizer state (named after its parameters) from
    every stage's file, `stage`'s last (a group's learning rate is named by its place in the
    stage's groups), and the weights it steps: loaded strictly, every name as it is (else
    MindSpore fills a name it does not find from one with another prefix)."""
    state = ms.load_checkpoint(os.path.join(where, "model.ckpt"))
    load_params(params, state, f"checkpoint {where!r}",
                "resume with the model that saved it, or start without resuming")
    own = optimizer_file(where, stage)
    for path in sorted(glob.glob(optimizer_file(where, "*")), key=lambda file: file == own):
        state.update(ms.load_checkpoint(path))
    missing, _ = ms.load_param_into_net(optimizer, state, strict_load=True)
    if missing:
        raise CheckpointError(f"checkpoint {where!r} has no optimizer state {missing[:3]}: it was "
                              "saved with another optimizer; resume with the one that saved it")


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def merge(directory):
    """Combine every `virtual-stage-<v>.ckpt` in `directory` into `directory/model.ckpt`."""
    paths = sorted(glob.glob(virtual_stage_file(directory, "*")),
                   key=lambda p: int(os.path.basename(p)[len(VIRTUAL_STAGE):-len(".ckpt")]))
    if not paths:
        raise CheckpointError(f"no virtual-stage-<v>.ckpt files in {directory!r}: point it at "
                              "a step directory that PipelineEngine.save wrote")
    named = {}                          # a weight tied across stages is saved by each: keep one
    for path in paths:
        named.update(ms.load_checkpoint(path))
    out = os.path.join(directory, "model.ckpt")
    save_params(out, named.items())
    return out


def clear(where):
    """Rank 0, before a save: empty the step directory, so that no file of a save cut short,
    or of another run or layout, is sealed or merged with this one."""
    shutil.rmtree(where, ignore_errors=True)


def finish(directory, step, meta, keep=2):
    """Rank 0, once every rank wrote its files: merge, seal with meta.json, point `latest` at
    it, and keep it and the newest `keep - 1` before it (a later one, another run's, stays)."""
    where = step_dir(directory, step)
    shutil.copyfile(merge(where), os.path.join(directory, ".model.ckpt.tmp"))
    files = {name: _sha256(os.path.join(where, name)) for name in sorted(os.listdir(where))
             if name.endswith(".ckpt")}
    meta = {**meta, "step": step, "sha256": files}
    _write_text(os.path.join(where, "meta.json"), json.dumps(meta, indent=1))
    os.replace(os.path.join(directory, ".model.ckpt.tmp"), os.path.join(directory, "model.ckpt"))
    _write_text(os.path.join(directory, "latest"), os.path.basename(where) + "\n")
    older = sorted(d for d in glob.glob(os.path.join(directory, STEP + "*")) if d < where)
    for old in older[:max(0, len(older) - keep + 1)]:
        shutil.rmtree(old, ignore_errors=True)


def newest(directory):
    """The step directory `latest` names (the newest sealed checkpoint), `directory` itself if
    it is a step directory (sealed or not: `latest` refuses it then), or None; unverified."""
    named = os.path.basename(os.path.normpath(directory)).startswith(STEP)
    if named or os.path.exists(os.path.join(directory, "meta.json")):
        return directory
    pointer = os.path.join(directory, "latest")
    if not os.path.exists(pointer):
        return None
    with open(pointer) as f:
        return os.path.join(directory, f.read().strip())


def latest(directory):
    """(step directory, meta) of the newest complete checkpoint, or a step's; files verified."""
    where = newest(directory)
    if where is None:
        raise CheckpointError(f"no checkpoint in {directory!r} (no 'latest' file): start without "
                              "resuming, or point it at a directory that PipelineEngine.save wrote")
    try:
        with open(os.path.join(where, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {where!r} has no readable meta.json ({e}): it is "
                              "damaged; resume from an older step directory") from e
    for name, digest in meta["sha256"].items():
        path = os.path.join(where, name)
        if not os.path.exists(path) or _sha256(path) != digest:
            raise CheckpointError(f"checkpoint file {path!r} is missing, truncated or altered "
                                  f"(SHA-256 does not match meta.json): refusing to load it; "
                                  "restore it or resume from an older step directory")
    return where, meta
