"""A rank's place: its stage, and its replica of the pipeline."""
from dataclasses import dataclass

__all__ = ["Topology"]


@dataclass(frozen=True)
class Topology:
    """D replicas of a P-stage pipeline, each on consecutive ranks. P=2, D=2:

        rank:     0  1  2  3
        stage:    0  1  0  1
        replica:  0  0  1  1

    A stage sends to its neighbours in its replica, and all-reduces with its replicas."""

    stages: int         # P: pipeline depth
    data_parallel: int  # D: pipeline replicas

    def check_world_size(self, world_size):
        """Fail fast, identically on every rank, when the launcher started the wrong number."""
        n = self.stages * self.data_parallel
        if world_size != n:
            raise ValueError(f"the launcher started {world_size} processes but stages={self.stages}"
                             f" x data_parallel={self.data_parallel} = {n}: launch with -n {n} "
                             f"(mpiexec) or --worker_num={n} (msrun), or change stages and "
                             f"data_parallel so that their product is {world_size}")

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
