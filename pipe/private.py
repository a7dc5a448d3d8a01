"""MindSpore's private APIs that pipe uses, here alone, each with a public fallback
(PIPE_PUBLIC_ONLY=1 forces them; tests/test_private.py: the same weights)."""
import os

from mindspore import nn, ops

__all__ = ["jit_executor", "relu_grad", "amp_level", "PUBLIC_ONLY"]

PUBLIC_ONLY = os.environ.get("PIPE_PUBLIC_ONLY") == "1"
try:
    if PUBLIC_ONLY:
        raise ImportError("PIPE_PUBLIC_ONLY=1")
    from mindspore.graph.api import _JitExecutor
    from mindspore.ops.operations._grad_ops import ReluGrad
except ImportError:
    _JitExecutor = ReluGrad = None


class PublicJit:
    """`ms.jit(run)`: compiles at its first call (`compile` is a no-op)."""

    def __init__(self, run, jit_config):
        import mindspore as ms
        self.run = ms.jit(run, jit_config=jit_config)

    def __call__(self, *arguments):
        return self.run(*arguments)

    def compile(self, *_):
        pass


def jit_executor(run, name, jit_config):
    """What `ms.jit(run)` runs, made once, with a `compile` that does not run it (the
    fallback compiles at the first call)."""
    if _JitExecutor is None:
        return PublicJit(run, jit_config)
    return _JitExecutor(run, name, jit_config=jit_config)


class ReluAt(nn.Cell):
    """ReLU's gradient at y by autograd: dy where y > 0 (relu(y) is run first)."""

    def __init__(self):
        super().__init__(auto_prefix=False)
        self.relu = nn.ReLU()
        self.grad = ops.GradOperation(sens_param=True)

    def construct(self, dy, y):
        return self.grad(self.relu)(y, dy)


def relu_grad():
    """(dy, y) -> dy where y > 0 for y a ReLU's output: MindSpore's ReluGrad kernel, or
    autograd's gradient of relu at y (the same values)."""
    return ReluAt() if ReluGrad is None else ReluGrad()


def amp_level(cell):
    """The level `mindspore.amp.auto_mixed_precision` set on `cell`, '' for none (MindSpore's
    `_amp_level`; in public, an 'auto' level's `amp_strategy` alone)."""
    public = "auto" if getattr(cell, "amp_strategy", None) is not None else ""
    return public if PUBLIC_ONLY else getattr(cell, "_amp_level", "") or ""
