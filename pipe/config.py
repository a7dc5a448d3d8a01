"""Everything that decides how a model is pipelined, in one object, checked before any message."""
import re
from dataclasses import dataclass, fields
from typing import Optional, Union

from pipe.schedule import CHUNKS

__all__ = ["PipelineConfig", "as_flags"]


def as_flags(message):
    """The library's errors name config fields (`batch_size=30`); a command-line program
    shows its user the flags instead (`--batch-size 30`): every program names a field's
    flag after it, with dashes."""
    names = sorted((f.name for f in fields(PipelineConfig)), key=len, reverse=True)
    return re.sub(rf"\b({'|'.join(names)})='?([^'\s:;,]*)'?",
                  lambda m: f"--{m.group(1).replace('_', '-')} {m.group(2)}", message)


@dataclass
class PipelineConfig:
    stages: int = 1                      # P: pipeline depth, one stage per rank
    data_parallel: int = 1               # D: pipeline replicas, each fed B/D samples
    micro_batches: int = 1               # M: micro-batches per replica per step
    batch_size: int = 1                  # B: global mini-batch per step
    schedule: str = "1f1b"               # a name from pipe.schedule.SCHEDULES
    chunks: Optional[int] = None         # v: model chunks per rank (None: pipe.schedule.CHUNKS)
    partition: Union[str, list] = "uniform"  # "uniform", "parameters", "time", or layer counts
    recompute: bool = False              # keep only stage inputs; rerun the forward in backward
    defer_wgrad: bool = False            # weight gradients at the flush, over all micro-batches at once
    device: str = "CPU"                  # MindSpore device target: CPU, GPU or Ascend
    timeout: float = 300.0               # seconds a send/receive may wait without progress
    clip_grad_norm: float = 0.0          # > 0: scale the gradients to at most this global L2 norm
    seed: int = 0                        # dropout masks: drawn from (seed, step, layer, sample)
    one_graph: bool = False              # run each step as one compiled graph (pipe.step_graph)

    def __post_init__(self):
        if self.chunks is None:
            self.chunks = CHUNKS.get(self.schedule, 1)

    def check(self):
        """Every mistake that can be found without talking to another rank."""
        for name in ("stages", "data_parallel", "micro_batches", "batch_size", "chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be a non-negative integer")
        for name in ("recompute", "defer_wgrad", "one_graph"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if not 0 <= self.clip_grad_norm < float("inf"):
            raise ValueError(f"clip_grad_norm={self.clip_grad_norm!r} must be 0 (off) or a "
                             "positive finite number")
        per_step = self.data_parallel * self.micro_batches
        if self.batch_size % per_step:
            raise ValueError(
                f"batch_size={self.batch_size} cannot be split over data_parallel="
                f"{self.data_parallel} replicas x micro_batches={self.micro_batches}: it must be "
                f"a multiple of {per_step}; try batch_size="
                f"{max(per_step, self.batch_size // per_step * per_step)}")
