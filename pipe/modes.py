"""How a step runs, decided once when the engine is built: as one compiled graph or action by
action (the loop), and each weight gradient per micro-batch or once at the end of the step.

Both are speed and memory, never the model trained. A config field left None is pipe's:
one graph (one call per step; the loop is for tracing and watching each action), and W
deferred by the rule below, from the config and the model's layers, the same on every rank."""
from dataclasses import dataclass

from mindspore import nn

from pipe.wire import every_rank

__all__ = ["Modes", "decide", "facts_of", "ONE_CALL"]

ONE_CALL = "one call per step instead of one per action"


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
    """What the rules read of the model: each true if it holds on any rank's stage."""
    buffers: bool          # a parameter is not trained (batch norm's statistics, a frozen weight)
    composite: bool        # a layer with weights is not an nn.Dense


def facts_of(wire, chunks):
    """This rank's Facts, made every rank's with one all-reduce (a model given as layer
    builders holds its layers on its own rank only)."""
    layers = [layer for chunk in chunks for layer in chunk.layers]
    mine = [any(chunk.buffers for chunk in chunks), any(map(is_composite, layers))]
    return Facts(*map(bool, every_rank(wire, mine).max(0)))   # (true on any rank)


def is_composite(layer):
    """A layer with weights that is more than one product: anything but an nn.Dense."""
    return type(layer) is not nn.Dense and bool(layer.trainable_params())


def decide(config, facts):
    """The config's modes, and for each it leaves None pipe's rule, with its reason."""
    defer, why_defer = defer_rule(config, facts)
    why = ([ONE_CALL] if config.one_graph is None else []) + \
        ([why_defer] if config.defer_wgrad is None else [])
    return Modes(True if config.one_graph is None else config.one_graph,
                 defer if config.defer_wgrad is None else config.defer_wgrad, tuple(why))


def defer_rule(config, facts):
    if config.recompute:
        return False, "recompute: deferring would keep every micro-batch's inputs to the end"
    if facts.buffers:
        return False, ("a parameter is not trained (batch norm's statistics, or a frozen "
                       "weight): one weight gradient over all rows would mix the statistics")
    if facts.composite:
        return False, ("a layer with weights is not an nn.Dense: one product over all rows "
                       "gains on plain products only")
    return True, "one product per layer over every micro-batch's rows"
