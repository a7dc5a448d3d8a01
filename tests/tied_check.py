"""Tied embedding/head under mpiexec: trains like one process, copies stay bitwise equal,
and the merged checkpoint loads into the unsplit model with MindSpore's own calls.

    mpiexec -n 4 python tests/tied_check.py STAGES DP DIR
"""
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import nn
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "tied"))
from model import batch, build_tied_model  # noqa: E402
from pipe.core.wire import SoloWire  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

stages, data_parallel, directory = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ms.set_device("CPU")
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def engine(config, wire=None):
    ms.set_seed(4)
    return PipelineEngine(build_tied_model(), loss_fn, lambda ps: nn.Adam(ps, learning_rate=0.01),
                          config, wire)


def table(e):
    """The embedding table: the only (32, 16) weight."""
    return next(p for p in e.layout.params if p.shape == (32, 16)).asnumpy()


pipe = engine(PipelineConfig(stages=stages, data_parallel=data_parallel, micro_batches=2, batch_size=8))
alone = engine(PipelineConfig(micro_batches=2, batch_size=8), SoloWire())
world = MPI.COMM_WORLD
holders = [r for r in range(world.size) if r % stages in (0, stages - 1)]
for step in range(5):
    tokens, targets = batch(32, 8, step)
    loss, reference = pipe.train_step(tokens, targets), alone.train_step(tokens, targets)
    assert abs(loss - reference) < 1e-5, (step, loss, reference)
    copies = world.allgather(table(pipe) if world.rank in holders else None)
    assert all(np.array_equal(copies[holders[0]], copies[r]) for r in holders), step
    if world.rank in holders:
        np.testing.assert_allclose(table(pipe), table(alone), rtol=1e-4, atol=1e-6)
pipe.save(directory, 5)
unsplit = build_tied_model()
assert ms.load_param_into_net(unsplit, ms.load_checkpoint(f"{directory}/model.ckpt")) == ([], [])
assert set(pipe.parameters_dict()) <= set(unsplit.parameters_dict()) == set(alone.parameters_dict())
for name, p in alone.parameters_dict().items():   # MindSpore names the tied table '3.table'
    np.testing.assert_allclose(unsplit.parameters_dict()[name].asnumpy(), p.asnumpy(),
                               rtol=1e-4, atol=1e-6, err_msg=name)
print(f"rank {world.rank}: 5 steps, losses equal, tied copies bitwise equal, checkpoint loads",
      flush=True)
