"""Splitting an `nn.SequentialCell` into contiguous pipeline stages."""
import statistics
import time
from functools import lru_cache
from itertools import accumulate

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipe.layers import Sequential, is_plain_sequence
from pipe.private import amp_level

__all__ = ["check_model", "check_layer", "partition", "balance", "stage_bounds", "profile_layers",
           "timed_costs", "whole_model_names"]


def check_model(model):
    """Refuse, with the reason and the fix, a model that pipe could not split exactly."""
    name = type(model).__name__
    refuse_amp(model, "the model")
    if not isinstance(model, nn.SequentialCell):
        raise TypeError(f"pipe splits an nn.SequentialCell into stages, layer by layer; the model "
                        f"is a {name}: list its layers in an nn.SequentialCell")
    if not (is_plain_sequence(model) or type(model) is Sequential):   # (pipe's own: it chains)
        raise TypeError(f"the model is a {name}, a SequentialCell subclass with its own construct: "
                        "pipe would split it by its children and skip that construct; wrap the "
                        "block with the skip connection as one layer of a plain nn.SequentialCell")
    for i in range(len(model)):
        check_layer(i, model[i])


def check_layer(i, layer):
    """Refuse the model's layer i (or a part of it) that pipe could not train exactly."""
    for name, cell in layer.cells_and_names():       # (a plain sequence pipe may take apart)
        if is_plain_sequence(cell):
            refuse_amp(cell, f"layer {i}{'.' + name if name else ''}")
    for p in layer.trainable_params():
        if p.dtype != ms.float32:
            raise TypeError(f"parameter {p.name!r} of layer {i} is {p.dtype}: pipe keeps float32 "
                            "master weights (the optimizer's small steps vanish in float16); "
                            "build the layer in float32 and set precision='fp16' for float16 "
                            "compute")


def refuse_amp(cell, what):
    """Refuse a cell pipe takes apart that is set for MindSpore's automatic mixed precision:
    MindSpore compiles the level with that cell, so its layers alone would lose it."""
    if amp_level(cell) not in ("", "O0"):
        raise TypeError(f"{what} is set for mindspore.amp.auto_mixed_precision (level "
                        f"{amp_level(cell)!r}), which its layers lose when pipe cuts it into "
                        "stages: pass it as built and set precision='fp16' (pipe casts every "
                        "layer to float16 and scales the loss)")


def balance(costs, stages):
    """Sizes of `stages` contiguous groups of `costs` minimising the costliest group: an
    exact dynamic programme over split points, ties to the earlier split."""
    costs = list(costs)
    prefix = [0, *accumulate(costs)]      # prefix[k]: the cost of costs[:k]

    @lru_cache(maxsize=None)
    def best(start, groups):
        """(max group cost, sizes) for costs[start:] cut into `groups` groups."""
        if groups == 1:
            return prefix[-1] - prefix[start], (len(costs) - start,)
        options = []
        for end in range(start + 1, len(costs) - groups + 2):
            rest_cost, rest_sizes = best(end, groups - 1)
            cost = max(prefix[end] - prefix[start], rest_cost)
            options.append((cost, (end - start,) + rest_sizes))
        return min(options, key=lambda o: o[0])

    return list(best(0, stages)[1])


class _LayerStep(nn.Cell):
    """One layer's forward and backward, compiled: what a stage spends on it per micro-batch."""

    def __init__(self, layer):
        super().__init__(auto_prefix=False)
        self.layer, self.weights = layer, ms.ParameterTuple(layer.trainable_params())
        self.grad = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)

    @ms.jit
    def construct(self, x, dy):
        return self.grad(self.layer, self.weights)(x, dy)


def profile_layers(model, x, repeats=5, clock=time.perf_counter):
    """Median seconds of each layer's forward + backward at input `x` on this device: the
    "time" partition's costs (torchgpipe's balance by time); `clock` reads the time."""
    costs = []
    for layer in model:
        y = layer(x)
        step = _LayerStep(layer)
        step(x, ops.ones_like(y))[0][0].asnumpy()            # compile and warm up
        times = []
        for _ in range(repeats):
            start = clock()
            step(x, ops.ones_like(y))[0][0].asnumpy()
            times.append(clock() - start)
        costs.append(statistics.median(times))
        x = y
    return costs


def stage_bounds(model: nn.SequentialCell, stages: int, method="uniform", chunks_per_stage=1):
    """[(first, last + 1)] layers per virtual stage, `stages` x `chunks_per_stage` of them.

        method: "uniform" (the extra layers to the first stages), "parameters" (balance the
        parameter count), a list of layer counts, or a tuple of per-layer costs to balance."""
    layers = len(model)
    if stages * chunks_per_stage > layers:
        raise ValueError(
            f"cannot split {layers} layers into stages={stages}: every stage needs at least one "
            f"layer; use stages={layers} or fewer, or a deeper model" if chunks_per_stage == 1 else
            f"cannot split {layers} layers into stages={stages} x chunks_per_stage="
            f"{chunks_per_stage} = {stages * chunks_per_stage} virtual stages: every one needs "
            "at least one layer; use fewer stages or chunks_per_stage, or a deeper model")
    stages *= chunks_per_stage
    if isinstance(method, tuple):
        if len(method) != layers:
            raise ValueError(f"{len(method)} layer costs given for a model of {layers} layers")
        sizes = balance(method, stages)
    elif isinstance(method, list):
        sizes = [int(s) for s in method]
        if len(sizes) != stages or sum(sizes) != layers or min(sizes) < 1:
            raise ValueError(f"explicit partition {sizes} must have {stages} positive sizes "
                             f"summing to the model's {layers} layers")
    elif method == "uniform":
        sizes = [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]
    elif method == "parameters":
        sizes = balance([sum(p.size for p in cell.get_parameters()) for cell in model], stages)
    else:
        raise ValueError(f"unknown partition method {method!r}: use 'uniform', 'parameters', "
                         "'time', or a list of layer counts per stage")
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def whole_model_names(model):
    """{id(parameter): its name in the whole `model`} as MindSpore's checkpoints name it
    (`3.weight`); a weight reachable by several paths (a tied weight, a cell used twice)
    takes the last one's, as MindSpore's."""
    paths = {}

    def walk(cell, path):                # (not cells_and_names: it gives a shared cell once)
        for name, p in cell.parameters_and_names(expand=False):
            paths.setdefault(id(p), []).append(path + name)
        for name, child in cell.name_cells().items():
            walk(child, f"{path}{name}.")
    for name, layer in model.name_cells().items():      # (a SequentialCell's, or the builders')
        walk(layer, f"{name}.")
    return {key: found[-1] for key, found in paths.items()}


def partition(model: nn.SequentialCell, bounds):
    """The layers of `bounds`, and the whole-model names of their parameters, then
    buffers (the order of `Chunk.state`): per-stage checkpoints merge into the unsplit model's."""
    first, last = bounds
    layers = [model[i] for i in range(first, last)]
    names = whole_model_names(model)
    params = {id(p): p for cell in layers for p in cell.trainable_params()}   # distinct, in order
    buffers = {id(p): p for cell in layers for p in cell.untrainable_params()}
    return layers, [names[i] for i in params] + [names[i] for i in buffers]


def timed_costs(model, sample, wire, world):
    """Per-layer costs for partition="time": each rank times every layer; the all-reduced
    mean is the same everywhere."""
    if sample is None:
        raise ValueError('partition="time" needs sample=<one micro-batch of inputs> to time '
                         'the layers')
    costs = np.array(profile_layers(model, ms.Tensor(np.asarray(sample))), np.float32)
    total = wire.all_reduce(ms.Tensor(costs), tuple(range(world))).asnumpy()
    return tuple(float(c) / world for c in total)
