"""What a pipelined run decides, in one object that checks itself before any message."""
from dataclasses import dataclass

__all__ = ["Config"]


@dataclass
class Config:
    stages: int = 1                      # P: pipeline depth, one stage per rank
    data_parallel: int = 1               # D: pipeline replicas, each fed B/D samples
    micro_batches: int = 1               # M: micro-batches per replica per step
    batch_size: int = 1                  # B: global mini-batch per step
    schedule: str = "1f1b"               # "gpipe" or "1f1b" (pipe.schedules names more)
    device: str = "CPU"                  # MindSpore device target: CPU, GPU or Ascend

    def check(self):
        """Every mistake that can be found without talking to another rank."""
        for name in ("stages", "data_parallel", "micro_batches", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        per_step = self.data_parallel * self.micro_batches
        if self.batch_size % per_step:
            raise ValueError(f"batch_size={self.batch_size} cannot be split over data_parallel="
                             f"{self.data_parallel} replicas x micro_batches={self.micro_batches}: "
                             f"it must be a multiple of {per_step}; try batch_size="
                             f"{max(per_step, self.batch_size // per_step * per_step)}")
