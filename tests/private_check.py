"""Trains the tests' MLP (ReLUs) 2 steps in the loop and 2 as one graph; run as a program,
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
    weights = {}
    for one_graph in (False, True):
        config = loop_config(batch_size=BATCH, micro_batches=2, one_graph=one_graph)
        engine = PipelineEngine(build_model(7), LOSS, optimizer("sgd"), config)
        for x, y in batches(7):
            engine.train_step(x, y)
        weights.update({f"{one_graph}-{n}": p.asnumpy() for n, p in engine.parameters_dict().items()})
    return weights


if __name__ == "__main__":
    np.savez(sys.argv[1], **train())
    print(f"private APIs: {'no' if private.PUBLIC_ONLY else 'yes'}")
