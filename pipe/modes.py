"""How a step runs, decided once when the engine is built: as one compiled graph or action by
action (the loop), and each weight gradient per micro-batch or once at the end of the step.

Both are speed and memory, never the model trained. A config field left None is decided by
the rules below, from the config and the model's layers, the same on every rank."""
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn

__all__ = ["Modes", "decide", "facts_of", "SMALL_STAGE", "MANY_LAYERS"]

SMALL_STAGE = 10_000_000   # parameters: a stage below it computes too little per action to
                           # hide the host's cost per call
MANY_LAYERS = 32           # layers: a stage above it issues so many kernels per action that
                           # the host issuing them one action at a time bounds the loop


@dataclass(frozen=True)
class Modes:
    one_graph: bool        # the step as one compiled graph, else the loop, action by action
    defer_wgrad: bool      # every weight gradient at the end of the step, over all micro-batches
    why: tuple = ()        # the reason of each mode the config left to pipe

    def __str__(self):
        how = ("the step runs as one compiled graph" if self.one_graph else
               "the step runs action by action")
        when = ("weight gradients at the end of the step" if self.defer_wgrad else
                "weight gradients with each micro-batch's backward")
        return f"{how}; {when}" + (f" ({'; '.join(self.why)})" if self.why else "")


@dataclass(frozen=True)
class Facts:
    """What the rules read of the model, the largest over every rank's stage."""
    buffers: bool          # a layer holds buffers (batch norm)
    composite: bool        # a layer with weights is not an nn.Dense
    parameters: int        # a stage's parameters
    layers: int            # a stage's layers


def facts_of(wire, chunks):
    """This rank's Facts, made the largest of every rank's with one all-reduce (a model
    given as layer builders holds its layers on its own rank only)."""
    layers = [layer for chunk in chunks for layer in chunk.layers]
    mine = np.array([any(chunk.buffers for chunk in chunks), any(map(is_composite, layers)),
                     sum(p.size for chunk in chunks for p in chunk.params), len(layers)],
                    np.float64)
    slots = np.zeros((wire.size, len(mine)), np.float32)
    slots[wire.rank] = mine
    if wire.size > 1:
        ranks = tuple(range(wire.size))
        slots = wire.all_reduce(ms.Tensor(slots.reshape(-1)), ranks).asnumpy().reshape(slots.shape)
    most = slots.max(0)
    return Facts(bool(most[0]), bool(most[1]), int(most[2]), int(most[3]))


def is_composite(layer):
    """A layer with weights that is more than one product: anything but an nn.Dense."""
    return type(layer) is not nn.Dense and bool(layer.trainable_params())


def decide(config, facts):
    """The config's modes, and for each it leaves None pipe's rule, with its reason."""
    defer, why_defer = defer_rule(config, facts)
    graph, why_graph = graph_rule(config, facts)
    why = ([why_graph] if config.one_graph is None else []) + \
        ([why_defer] if config.defer_wgrad is None else [])
    return Modes(graph if config.one_graph is None else config.one_graph,
                 defer if config.defer_wgrad is None else config.defer_wgrad, tuple(why))


def defer_rule(config, facts):
    if config.recompute:
        return False, "recompute: deferring would keep every micro-batch's inputs to the end"
    if facts.buffers:
        return False, "batch norm: one weight gradient over all rows would mix their statistics"
    if facts.composite:
        return False, ("a layer with weights is not an nn.Dense: one product over all rows "
                       "gains on plain products only")
    return True, "one product per layer over every micro-batch's rows"


def graph_rule(config, facts):
    if config.precision == "fp16":
        return True, "fp16: the weights are cast once per step, not once per action"
    if config.stages == 1 or config.device == "CPU":
        return True, "one call per step instead of one per action"
    if facts.parameters < SMALL_STAGE:
        return True, "small stages: the host's cost per action would dominate"
    if facts.layers > MANY_LAYERS:
        return True, "many layers per stage: issuing them action by action bounds the host"
    return False, "large fp32 actions between GPUs: each hides the host's cost per call"
