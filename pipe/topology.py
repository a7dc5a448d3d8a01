"""Which stage and which data-parallel replica each rank runs, and who its neighbours are."""
from dataclasses import dataclass

__all__ = ["Topology"]


@dataclass(frozen=True)
class Topology:
    """A grid of `stages` x `data_parallel` ranks: D replicas of a P-stage pipeline.

    Ranks of one pipeline are consecutive: replica r runs stages 0..P-1 on ranks
    r*P .. r*P+P-1. So with P=2, D=2 the layout is

        rank:     0  1  2  3
        stage:    0  1  0  1
        replica:  0  0  1  1

    A stage talks point-to-point with the previous and next stage of its own replica,
    and all-reduces its weight gradients with the same stage of every other replica.
    """

    stages: int         # P: pipeline depth
    data_parallel: int  # D: pipeline replicas

    def __post_init__(self):
        if self.stages < 1 or self.data_parallel < 1:
            raise ValueError(f"stages={self.stages} and data_parallel={self.data_parallel} "
                             "must both be at least 1")

    @property
    def world_size(self) -> int:
        return self.stages * self.data_parallel

    def check_world_size(self, world_size: int) -> None:
        """Fail fast, identically on every rank, when the launcher started the wrong number."""
        if world_size != self.world_size:
            raise ValueError(
                f"the launcher started {world_size} processes but stages={self.stages} x "
                f"data_parallel={self.data_parallel} = {self.world_size}: launch with "
                f"-n {self.world_size} (mpiexec) or --worker_num={self.world_size} (msrun), "
                f"or change stages and data_parallel so that their product is {world_size}")

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def rank_of(self, stage: int, replica: int) -> int:
        return replica * self.stages + stage

    def pipeline_ranks(self, replica: int) -> tuple:
        """The ranks of one pipeline, in stage order."""
        return tuple(self.rank_of(s, replica) for s in range(self.stages))

    def data_parallel_ranks(self, stage: int) -> tuple:
        """The ranks that hold a copy of `stage` and all-reduce its gradients."""
        return tuple(self.rank_of(stage, r) for r in range(self.data_parallel))
