"""What pipe chooses when a config leaves `defer_wgrad` or `one_graph` to it (None, the default).

The choices change speed and memory, never the model trained. The rules, by measurement
(docs/performance.md, "pipe's choices"): W deferred to the flush unless `recompute` says
memory is short, a layer holds buffers (batch norm), or a layer with weights is not an
nn.Dense outside one stage's fp16 graph; the step as one graph unless it runs in fp32 on
GPUs with messages between stages and actions long enough (HOST_BOUND_FLOPS) to hide the
host's cost per call, and short enough in kernels: layers that are not nn.Dense on two
stages run as one graph."""
import math

import mindspore as ms
import numpy as np
from mindspore import nn

from pipe.wire import elements

__all__ = ["LEFT", "HOST_BOUND_FLOPS", "choose_defer", "is_composite", "is_fp16_graph",
           "choose_graph",
           "action_flops", "most_of", "announce"]

LEFT = ("defer_wgrad", "one_graph")     # the config fields pipe decides when they are None

# Below this many floating-point operations per action, the host's 0.2-0.5 ms per call
# bounds an fp32 step on a GPU.
HOST_BOUND_FLOPS = 1e10


def choose_defer(config, buffers, composite=False):
    """(whether to defer W, why); `buffers` / `composite`: some rank's layers hold buffers /
    a layer with weights that is not an nn.Dense."""
    if config.recompute:
        return False, "W per micro-batch (recompute says memory is short; deferring keeps " \
                      "every micro-batch's activations until the flush)"
    if buffers:
        return False, ("W per micro-batch (batch norm: W over all rows would use their joint "
                       "statistics)")
    if composite and not (is_fp16_graph(config) and config.stages == 1):
        return False, ("W per micro-batch (a layer with weights is not an nn.Dense: deferred, "
                       "its W measured faster on the GPT only on one stage in an fp16 graph)")
    return True, ("W deferred to the flush (every micro-batch's at the step's end, one product per "
                  "layer over all of them)")


def is_composite(layer):
    """A layer with weights whose deferred W measured slower: anything but an nn.Dense."""
    return type(layer) is not nn.Dense and bool(layer.trainable_params())


def is_fp16_graph(config):
    """Whether the step runs as one graph in fp16: always, unless the config says otherwise."""
    return config.precision == "fp16" and config.one_graph is not False


def choose_graph(config, flops, composite=False):
    """(whether to run the step as one graph, why); `flops`: the most any action computes;
    `composite`: some rank has a layer with weights that is not an nn.Dense (many kernels)."""
    if is_fp16_graph(config):
        return True, "one graph per step (fp16: the weights are cast once per step, not per action)"
    if flops < HOST_BOUND_FLOPS:
        return True, (f"one graph per step ({flops / 1e9:.2g} GFLOP per action: the host's cost "
                      "per action would dominate)")
    if config.device == "CPU":
        return True, "one graph per step (on CPU it measured 2x faster than the loop)"
    if config.stages == 1:
        return True, (f"one graph per step (one stage, no messages: as fast as the loop at "
                      f"{flops / 1e9:.0f} GFLOP per action, as measured)")
    if composite and config.stages == 2:
        return True, ("one graph per step (two stages of layers that are not nn.Dense: the host "
                      "issuing their many kernels per action bounds the loop, as measured)")
    return False, (f"the per-action loop ({flops / 1e9:.0f} GFLOP per action hides the host's "
                   "cost, and one graph with messages between stages measured slower in fp32 "
                   "there)")


def action_flops(chunks, specs):
    """The most flops one F of this rank's chunks computes: 2 x (vectors in its input) x
    (its parameters), a float input (rows, ..., width) having rows x ... vectors."""
    most = 0
    for chunk, spec in zip(chunks, specs):
        shape, dtype = elements(spec)[0]      # a tuple: its first element (hidden states)
        vectors = math.prod(shape[:-1]) if dtype.is_floating_point else math.prod(shape)
        most = max(most, 2 * vectors * sum(p.size for p in chunk.params))
    return most


def most_of(wire, value):
    """The largest of every rank's `value` (an all-reduce sums: each rank fills its own slot)."""
    slots = np.zeros(wire.size, np.float32)
    slots[wire.rank] = value
    return float(wire.all_reduce(ms.Tensor(slots), tuple(range(wire.size))).asnumpy().max())


def announce(choices):
    """The one line a run starts with when pipe chose: `choices`, the why of each."""
    return ("pipe chose " + "; ".join(choices) +
            " (set defer_wgrad / one_graph to choose otherwise)")
