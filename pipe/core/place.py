"""A rank's place: its stage and its replica, and its micro-batches of each step's batch."""
from dataclasses import dataclass, field
from functools import cached_property

import mindspore as ms
import numpy as np

__all__ = ["Topology", "MicroBatches", "split"]


@dataclass(frozen=True)
class Topology:
    """D replicas of a P-stage pipeline, each on consecutive ranks. P=2, D=2:

        rank:     0  1  2  3
        stage:    0  1  0  1
        replica:  0  0  1  1

    A stage sends to its neighbours in its replica, and all-reduces with its replicas.
    """

    stages: int         # P: pipeline depth
    data_parallel: int  # D: pipeline replicas

    @property
    def world_size(self):
        return self.stages * self.data_parallel

    def check_world_size(self, world_size):
        """Fail fast, identically on every rank, when the launcher started the wrong number."""
        if world_size != self.world_size:
            raise ValueError(
                f"the launcher started {world_size} processes but stages={self.stages} x "
                f"data_parallel={self.data_parallel} = {self.world_size}: launch with "
                f"-n {self.world_size} (mpiexec) or --worker_num={self.world_size} (msrun), "
                f"or change stages and data_parallel so that their product is {world_size}")

    def stage_of(self, rank):
        return rank % self.stages

    def replica_of(self, rank):
        return rank // self.stages

    def rank_of(self, stage, replica):
        return replica * self.stages + stage

    def pipeline_ranks(self, replica):
        """The ranks of one pipeline, in stage order: its stages' ranks."""
        return tuple(self.rank_of(s, replica) for s in range(self.stages))

    def data_parallel_ranks(self, stage):
        """The ranks that hold a copy of `stage` and all-reduce its gradients."""
        return tuple(self.rank_of(stage, r) for r in range(self.data_parallel))


@dataclass
class MicroBatches:
    """One step's micro-batches: `source` (inputs, labels) as given, `cut` each micro-batch's
    rows of it (tensors cut at first use), and the last stage's `outputs`."""
    source: tuple
    cut: list
    outputs: list = field(default_factory=list)   # the last stage's losses (or outputs)

    @cached_property
    def inputs(self):
        return [_tensor(self.source[0][c]) for c in self.cut]

    @cached_property
    def labels(self):
        return [_tensor(self.source[1][c]) for c in self.cut]

    def rows(self):
        """This replica's (inputs, labels), uncut."""
        mine = slice(self.cut[0].start, self.cut[-1].stop)
        return tuple(_tensor(a if mine == slice(0, len(a)) else a[mine]) for a in self.source)


def _tensor(array):
    return array if isinstance(array, ms.Tensor) else ms.Tensor(np.asarray(array))


def split(config, inputs, labels, replica):
    """Replica `replica`'s M micro-batches of the global batch: rows [r B/D, (r+1) B/D),
    in M equal pieces."""
    M, D = config.micro_batches, config.data_parallel
    if len(inputs) != config.batch_size or len(labels) != len(inputs):
        raise ValueError(f"train_step got {len(inputs)} inputs and {len(labels)} labels; "
                         f"batch_size={config.batch_size} is configured")
    size = config.batch_size // (D * M)
    return MicroBatches((inputs, labels), [slice((replica * M + m) * size, (replica * M + m + 1) * size)
                                           for m in range(M)])
