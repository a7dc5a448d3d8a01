"""A compiled piece of work, called from Python the way MindSpore's own training step is.

The loop (pipe.actions) calls each piece as one compiled graph: a chunk's F, B, I and W,
its forward for predict, the optimizer's update, fp16's unscale, a (sum, count) loss's
count; a step as one graph (pipe.step_graph) is one call of one. MindSpore compiles a
cell's construct when a `jit` function calls it. A construct made `jit` itself compiles
the same graph, but every call then also pays MindSpore's bookkeeping of the Cell (its
compile cache sets attributes on the cell, `Cell.__call__` checks the arguments): about
30 us a call on CPU and 50 on a GPU's host (benchmarks/log.md, section 48), as much as a
small model's whole step differs by. `Compiled` wraps a cell so that a call from Python
runs it through one `jit` function's executor, while a graph that traces it (the step's)
sees the cell itself, inlined as any other.
"""
from itertools import count

import mindspore as ms
from mindspore import nn
from mindspore.graph.api import _JitExecutor   # (`executor` says why)

__all__ = ["Compiled", "executor"]

NAMES = count()                          # each executor's own name in MindSpore's compile cache


def executor(cell):
    """What a `jit` function calling `cell` runs, made once, with `ms.jit`'s defaults (a
    `jit` function makes one at each call). Its `compile` compiles without running, for
    which MindSpore has no public call (pipe.step_graph.StepGraph.prepare)."""
    def run(*arguments):
        return cell(*arguments)
    name = next(NAMES)
    run.__name__ = f"{type(cell).__name__}_{name}"   # its entries' name in the compile cache (one
    # name for many executors: MindSpore warns "compiled again" at each new one)
    return _JitExecutor(run, name, jit_config=ms.JitConfig(jit_level="O0", jit_syntax_level="LAX"))


class Compiled(nn.Cell):
    """`cell` as one compiled graph per call from Python; traced in another graph, the cell.
    (Its parameters keep their names: no prefix.)"""

    def __init__(self, cell):
        super().__init__(auto_prefix=False)
        self.cell, self.executor = cell, executor(cell)

    def __call__(self, *args):
        return self.executor(*args)

    def construct(self, *args):
        return self.cell(*args)
