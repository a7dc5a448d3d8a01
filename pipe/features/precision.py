"""Mixed precision: float16 compute and messages, float32 master weights, a dynamic loss scale.

With precision="fp16" every layer computes in float16 (`Cell.to_float`; batch norm keeps
float32, as MindSpore's own mixed precision does) and activations cross stages in float16.
Weight gradients come out float32 and are summed in float32; the optimizer steps float32
weights. The logits are cast to float32 for the loss, whose gradient is scaled by S, then
cast to float16. `LossScaler.unscale` divides by S and decides with one all-reduce whether
the step overflowed where one process's would (`Unscale`): then every rank skips it and
halves S; after `window` clean steps S doubles (DynamicLossScaleUpdateCell's rule)."""
import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.compiled import Compiled, scalar

__all__ = ["LossScaler", "Unscale", "float16_gradients", "LogitsAsFloat32", "GradAsFloat16",
           "computes_half", "forward_piece", "backward_piece", "to_half", "check_layer_precision",
           "set_matmul_precision"]

NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def set_matmul_precision(config):
    """On GPU, float32 products in TF32 exactly when `config.tf32` says so (set either way)."""
    if config.device == "GPU":
        ms.device_context.gpu.op_precision.matmul_allow_tf32(config.tf32)


def to_half(layers):
    """Each layer computes in float16, its batch norms in float32; parameters stay float32."""
    for layer in layers:
        layer.to_float(ms.float16)
        for cell in norms(layer):
            cell.to_float(ms.float32)


def norms(layer):
    return [cell for _, cell in layer.cells_and_names() if isinstance(cell, NORMS)]


def check_layer_precision(i, layer, precision):
    """Refuse a layer the user cast to half precision under precision='fp32': its
    gradient would reach float16 unscaled and underflow."""
    if precision == "fp16":
        return
    for _, cell in layer.cells_and_names():
        flags = cell.get_flags()
        if flags.get("fp16") or flags.get("bf16"):
            raise TypeError(f"layer {i} ({type(layer).__name__}) computes in "
                            f"{'float16' if flags.get('fp16') else 'bfloat16'} (Cell.to_float), "
                            "and precision='fp32' would pass its gradients unscaled, where they "
                            "underflow; drop the to_float and set precision='fp16' (pipe casts "
                            "every layer and scales the loss)")


def computes_half(layer):
    """Whether the layer computes in float16 (`Cell.to_float`, as `to_half` casts it)."""
    return bool(layer.get_flags().get("fp16"))


def is_logits_layer(chunk, i):
    return chunk.is_last and i == len(chunk.layers) - 1


def forward_piece(chunk, i, piece):
    """(fp16's piece rule, pipe.chunk) The model's last layer gives float32 logits."""
    return LogitsAsFloat32(piece) if is_logits_layer(chunk, i) else piece


def backward_piece(chunk, i, grad):
    """... and its backward casts their (scaled) float32 gradient to float16."""
    return GradAsFloat16(grad) if is_logits_layer(chunk, i) else grad


class LogitsAsFloat32(nn.Cell):
    """The model's last layer as the forward runs it, its output cast to float32."""

    def __init__(self, kept):
        super().__init__(auto_prefix=False)
        self.kept, self.residual_count = kept, kept.residual_count

    def construct(self, x, extras):
        y, residuals = self.kept(x, extras)
        return y.astype(ms.float32), residuals


class GradAsFloat16(nn.Cell):
    """The model's last layer's backward, its float32 (scaled) output gradient cast to float16."""

    def __init__(self, grad):
        super().__init__(auto_prefix=False)
        self.grad = grad

    def construct(self, x, dy):
        return self.grad(x, dy.astype(ms.float16))


FLOAT16_INF = 65520.0    # the smallest magnitude float16 rounds to inf (65504 + half its step)


def float16_gradients(chunk_layers, params):
    """Per parameter: whether one process's fp16 step makes its gradient as a float16
    product (every layer's but a batch norm's)."""
    kept = {id(p) for layer in chunk_layers for cell in norms(layer)
            for p in cell.trainable_params()}
    return tuple(id(p) not in kept for p in params)


def _total(g):
    return g.sum()


def _peak(g):
    return ops.abs(g).max()


class Unscale(nn.Cell):
    """(gradients, 1/S) -> (each x 1/S, 1.0 if the step overflowed else 0.0), one graph.

        Overflowed where one process's fp16 step on the whole batch would: an inf or nan, or a
        gradient that process makes in float16 (`half[i]`) at least FLOAT16_INF x 1/S. pipe's
        float32 sums keep such a gradient finite where float16 rounds it to inf: this makes it
        the same overflow, whatever the schedule, `defer_wgrad` or layout. Each per-gradient
        step is one HyperMap, which compiles faster than a loop (docs/performance.md)."""

    def __init__(self, half):
        super().__init__()
        self.half = ms.Tensor(np.array(half, np.float32)) if any(half) else None
        self.each = ops.HyperMap()

    def construct(self, grads, inverse):
        unscaled = self.each(ops.partial(ops.mul, inverse), grads)
        overflow = ops.logical_not(ops.isfinite(ops.addn(self.each(_total, unscaled))))
        if self.half is not None:        # the largest float16 product, the others masked
            peak = (ops.stack(self.each(_peak, unscaled)) * self.half).max()
            overflow = ops.logical_or(overflow, peak >= FLOAT16_INF * inverse)
        return unscaled, overflow.astype(ms.float32).reshape(1)


class LossScaler:
    """The loss scale S, and what it does each step (see the module's docstring)."""

    def __init__(self, value, window, half):
        """`half`: per gradient the step sums, whether it is a float16 product (Unscale)."""
        self.value, self.window = float(value), window
        self.clean = 0                   # steps since the last overflow or growth
        self.unscale_cell = Compiled(Unscale(half))

    def unscale(self, wire, grads):
        """(`grads` / S, whether the optimizer may step), one all-reduce of the overflow flag
        over every rank; S is updated."""
        flag = ops.zeros(1, ms.float32)
        if grads:
            grads, flag = self.unscale_cell(ms.mutable(grads), scalar(1.0 / self.value))
        overflow = bool(wire.all_reduce(flag, tuple(range(wire.size))).asnumpy()[0])
        self.update(overflow)
        return grads, not overflow

    def update(self, overflow):
        """Halve S on an overflow (not below 1); double it after `window` clean steps."""
        if overflow:
            self.value, self.clean = max(self.value / 2, 1.0), 0
            return
        self.clean += 1
        if self.clean >= self.window:
            self.value, self.clean = self.value * 2, 0

    def state(self):
        """What a checkpoint keeps, to resume with the same scale."""
        return {"loss_scale": self.value, "loss_scale_clean_steps": self.clean}

    def load(self, meta):
        """Resume S from a checkpoint's meta (one saved in fp32 keeps the configured start)."""
        self.value = float(meta.get("loss_scale", self.value))
        self.clean = int(meta.get("loss_scale_clean_steps", 0))
