"""Tied embedding/head on the ranks of a communicator (in the suite's one launch:
tests/mpi_worker.py): trains like one process, copies stay bitwise equal, and the merged
checkpoint loads into the unsplit model with MindSpore's own calls. `pipe_run` returns
what each rank found; tests/test_tied.py checks it."""
import os

import mindspore as ms
import numpy as np
from launch import load_example, loop_config
from mindspore import nn

from pipe.engine import PipelineEngine
from pipe.ops.deadlines import DeadlineWire
from pipe.wire import SoloWire

tied = load_example("tied_model", "tied", "model.py")   # (examples/gpt has a `model` too)

STEPS = 5
LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def engine(config, wire, other_copy=False):
    """`other_copy`: the head's copy of the table built other than the embedding's (as on
    ranks that build unseeded): pipe starts it from the embedding's (pipe.engine.same_start)."""
    ms.set_seed(4)
    model = tied.build_tied_model()
    if other_copy:
        model[0].embedding_table.set_data(model[0].embedding_table.value() + 1.0)
    return PipelineEngine(model, LOSS, lambda ps: nn.Adam(ps, learning_rate=0.01), config, wire)


def table(e):
    """The embedding table: the only (32, 16) weight."""
    return next(p for p in e.layout.params if p.shape == (32, 16)).asnumpy()


def pipe_run(spec, communicator):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    stages, rank = spec["config"]["stages"], communicator.Get_rank()
    pipe = engine(loop_config(micro_batches=2, batch_size=8, **spec["config"]),
                  DeadlineWire(120.0, communicator), other_copy=rank % stages == stages - 1)
    alone = engine(loop_config(micro_batches=2, batch_size=8), SoloWire())
    holders = [r for r in range(communicator.Get_size()) if r % stages in (0, stages - 1)]
    found = {"losses": True, "copies": True, "table": True}
    for step in range(STEPS):
        tokens, targets = tied.batch(32, 8, step)
        loss, reference = pipe.train_step(tokens, targets), alone.train_step(tokens, targets)
        found["losses"] &= abs(loss - reference) < 1e-5
        copies = communicator.allgather(table(pipe) if rank in holders else None)
        found["copies"] &= all(np.array_equal(copies[holders[0]], copies[r]) for r in holders)
        if rank in holders:
            found["table"] &= bool(np.allclose(table(pipe), table(alone), rtol=1e-4, atol=1e-6))
    pipe.save(spec["save"], STEPS)
    unsplit = tied.build_tied_model()
    found["loads"] = ms.load_param_into_net(unsplit, ms.load_checkpoint(
        os.path.join(spec["save"], "model.ckpt"))) == ([], [])
    found["names"] = set(pipe.parameters_dict()) <= set(unsplit.parameters_dict()) == \
        set(alone.parameters_dict())
    found["merged"] = all(np.allclose(unsplit.parameters_dict()[name].asnumpy(), p.asnumpy(),
                                      rtol=1e-4, atol=1e-6)      # MindSpore names the tied
                          for name, p in alone.parameters_dict().items())   # table '3.table'
    return pipe, found
