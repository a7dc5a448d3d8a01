"""Everything that decides how a model is pipelined, in one object, checked before any message.
`defer_wgrad` and `one_graph` left None are decided by pipe when the engine is built
(pipe.modes); every choice trains one process's model."""
from dataclasses import dataclass
from typing import Optional, Union

from pipe.schedules import CHUNKS_PER_STAGE

__all__ = ["PipelineConfig"]


@dataclass
class PipelineConfig:
    stages: int = 1                      # P: pipeline depth, one stage per rank
    data_parallel: int = 1               # D: pipeline replicas, each fed B/D samples
    micro_batches: int = 1               # M: micro-batches per replica per step
    batch_size: int = 1                  # B: global mini-batch per step
    schedule: str = "1f1b"               # one of pipe.schedules.SCHEDULES
    device: str = "CPU"                  # MindSpore device target: CPU, GPU or Ascend
    chunks_per_stage: Optional[int] = None   # v (None: pipe.schedules.CHUNKS_PER_STAGE's)
    partition: Union[str, list] = "uniform"  # "uniform", "parameters", "time", or layer counts
    recompute: bool = False              # keep only stage inputs; rerun the forward in backward
    defer_wgrad: Optional[bool] = None   # W at the flush, over all micro-batches' rows at once
    timeout: float = 300.0               # seconds a send/receive may wait without progress
    seed: int = 0                        # dropout masks: drawn from (seed, step, layer, sample)
    one_graph: Optional[bool] = None     # each step as one compiled graph (pipe.step)
    precision: str = "fp32"              # "fp16": float16 compute, loss scaled (features.precision)
    tf32: bool = False                   # GPU: float32 products in TF32 (faster, 10-bit mantissa)
    loss_scale: float = 2.0 ** 16        # fp16: the loss scale S to start from
    loss_scale_window: int = 2000        # fp16: clean steps before S doubles
    clip_grad_norm: float = 0.0          # > 0: scale the gradients to at most this global L2 norm

    def __post_init__(self):
        if self.chunks_per_stage is None:
            self.chunks_per_stage = CHUNKS_PER_STAGE.get(self.schedule, 1)

    def check(self):
        """Every mistake that can be found without talking to another rank."""
        for name in ("stages", "data_parallel", "micro_batches", "batch_size", "chunks_per_stage",
                     "loss_scale_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.device not in ("CPU", "GPU", "Ascend"):
            raise ValueError(f"device={self.device!r} must be 'CPU', 'GPU' or 'Ascend'")
        if not 0 < self.timeout < float("inf"):
            raise ValueError(f"timeout={self.timeout!r} must be a positive number of seconds")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be a non-negative integer")
        if self.precision == "bf16":
            raise ValueError("precision='bf16' is not available: MindSpore 2.10 has no bfloat16 "
                             "kernels on CPU or GPU (no bfloat16 Cast on GPU, no bfloat16 MatMul "
                             "on CPU); use precision='fp16' (with loss scaling) or 'fp32'")
        if self.precision not in ("fp32", "fp16"):
            raise ValueError(f"precision={self.precision!r} must be 'fp32' or 'fp16'")
        for name in ("tf32", "recompute"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.tf32 and self.device != "GPU":
            raise ValueError(f"tf32=True is an NVIDIA GPU's matrix-product mode, and device="
                             f"{self.device!r} multiplies in float32 whatever it is set to; drop "
                             "tf32=True or use device='GPU'")
        if not 1 <= self.loss_scale < float("inf"):
            raise ValueError(f"loss_scale={self.loss_scale!r} must be a finite number >= 1")
        if not 0 <= self.clip_grad_norm < float("inf"):
            raise ValueError(f"clip_grad_norm={self.clip_grad_norm!r} must be 0 (off) or a "
                             "positive finite number")
        for name in ("defer_wgrad", "one_graph"):     # None: pipe chooses (pipe.modes)
            if not isinstance(getattr(self, name), (bool, type(None))):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True, False or None "
                                 "(pipe chooses)")
        per_step = self.data_parallel * self.micro_batches
        if self.batch_size % per_step:
            raise ValueError(f"batch_size={self.batch_size} cannot be split over data_parallel="
                             f"{self.data_parallel} replicas x micro_batches={self.micro_batches}: "
                             f"it must be a multiple of {per_step}; try batch_size="
                             f"{max(per_step, self.batch_size // per_step * per_step)}")
