"""Trains the tests' MLP (ReLUs) 2 steps in the loop (every piece a compiled call through
pipe.private's executor, each ReLU's backward its ReluGrad); run as a program,
saves the weights to argv[1] (.npz) and says whether MindSpore's private APIs were used
(pipe.private)."""
import sys

import mindspore as ms
import numpy as np
from launch import loop_config
from mlp_run import BATCH, LOSS, batches, build_model, optimizer

from pipe import private
from pipe.engine import PipelineEngine


def train():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    engine = PipelineEngine(build_model(7), LOSS, optimizer("sgd"),
                            loop_config(batch_size=BATCH, micro_batches=2))
    for x, y in batches(7):
        engine.train_step(x, y)
    return {n: p.asnumpy() for n, p in engine.parameters_dict().items()}


if __name__ == "__main__":
    np.savez(sys.argv[1], **train())
    print(f"private APIs: {'no' if private.PUBLIC_ONLY else 'yes'}")
