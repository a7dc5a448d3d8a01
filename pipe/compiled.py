"""A compiled piece of work, called from Python as MindSpore's own training step is.

`Compiled` wraps a cell so that a call from Python runs one `jit` function's executor, made
once (a `jit` construct would also pay the Cell's bookkeeping at every call), while a graph
that traces it sees the cell itself."""
from functools import lru_cache
from itertools import count

import mindspore as ms
from mindspore import nn

from pipe.private import jit_executor

__all__ = ["Compiled", "executor", "scalar"]

NAMES = count()                          # each executor's own name in MindSpore's compile cache


def executor(cell):
    """What a `jit` function calling `cell` runs, made once (pipe.private.jit_executor)."""
    def run(*arguments):
        return cell(*arguments)
    name = next(NAMES)
    run.__name__ = f"{type(cell).__name__}_{name}"   # its own name in the compile cache
    return jit_executor(run, name, ms.JitConfig(jit_level="O0", jit_syntax_level="LAX"))


class Compiled(nn.Cell):
    """`cell` as one compiled graph per call from Python; traced in another graph, the cell."""

    def __init__(self, cell):
        super().__init__(auto_prefix=False)
        self.cell, self.executor = cell, executor(cell)

    def __call__(self, *args):
        return self.executor(*args)

    def construct(self, *args):
        return self.cell(*args)


@lru_cache(maxsize=16)
def scalar(value):
    """`value` as the float32 tensor a compiled call takes, made once per value (a loss scale
    moves by halving and doubling: a few values)."""
    return ms.Tensor(value, ms.float32)
