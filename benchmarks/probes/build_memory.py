"""Memory per rank of the large MLP (16 x 8192, 8192 inputs: 1074 M parameters, 4.0 GiB fp32)
built whole on every rank or only a rank's own layers (layer builders).
    python benchmarks/probes/build_memory.py whole|own P   (under msrun for P > 1)

Recorded in benchmarks/log.md, section 11."""
import gc
import json
import os
import resource
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "mnist"))
from train import mlp_layers  # noqa: E402
from pipe.cli import use_device  # noqa: E402
from pipe.config import PipelineConfig  # noqa: E402
from pipe.engine import PipelineEngine  # noqa: E402

if len(sys.argv) != 3 or sys.argv[1] not in ("whole", "own") or not sys.argv[2].isdigit() \
        or int(sys.argv[2]) < 1:
    print(f"error: {' '.join(sys.argv[1:]) or 'no arguments'}: use whole|own and a stage count "
          "P >= 1, e.g. own 2", file=sys.stderr)
    sys.exit(2)
build, P = sys.argv[1], int(sys.argv[2])
ms.set_context(mode=ms.PYNATIVE_MODE)
use_device("GPU")
layers = mlp_layers(16, 8192, 8192)
model = layers if build == "own" else nn.SequentialCell([b() for b in layers])
B, M = 256, max(P, 2)
x = np.random.default_rng(0).standard_normal((B, 8192)).astype(np.float32)
y = np.random.default_rng(1).integers(0, 10, B).astype(np.int32)
config = PipelineConfig(stages=P, micro_batches=M, batch_size=B, device="GPU")
engine = PipelineEngine(model, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                        lambda ps: nn.SGD(ps, learning_rate=1e-3), config, sample=x[:B // M])
gc.collect()
held = sum(o.size for o in gc.get_objects()          # the model's Parameters, not optimizer state
           if issubclass(type(o), ms.Parameter) and o.name[:1].isdigit())
before = ms.runtime.memory_allocated()
engine.train_step(ms.Tensor(x), ms.Tensor(y))
engine.train_step(ms.Tensor(x), ms.Tensor(y))
ms.runtime.synchronize()
print("MEM " + json.dumps({
    "build": build, "P": P, "rank": engine.wire.rank,
    "model_parameters_alive_M": round(held / 1e6, 1),
    "stage_parameters_M": round(sum(p.size for p in engine.layout.params) / 1e6, 1),
    "device_before_step_MiB": round(before / 2**20),
    "device_after_2_steps_MiB": round(ms.runtime.memory_allocated() / 2**20),
    "device_peak_MiB": round(ms.runtime.max_memory_allocated() / 2**20),
    "host_peak_rss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}),
      flush=True)
