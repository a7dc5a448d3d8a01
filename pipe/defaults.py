"""What pipe chooses when a config leaves `defer_wgrad` or `one_graph` to it (None, the default).

Either way a step trains the same bits (tests/test_transparency.py); the choices differ in
speed and memory, as measured on 2 x H200 (docs/performance.md) and on 2 CPU cores:

- Deferred W computes each layer's weight gradient once per step, as one matrix product
  over the rows of all M micro-batches, not as M thin products each added into the sum:
  the large MLP's ZB-V step fell from 109.8 to 85.1 ms, the small one's is unchanged. Its
  cost is memory (every micro-batch keeps its layers' inputs and output gradients until
  the flush). For anything but a Dense the gain is launches only: W differentiates a
  layer's weights again at its kept input, and with the GPT example's blocks cut into
  pieces of one product each (docs/models.md) and a norm's W taken in I, joining the
  GPT's rows copies them at about the time the launches it saves took. On one H200 at
  M=4, in turn with W per micro-batch, deferring measured 0.94x (twice), 0.987x and
  1.009x in fp16 as one graph, where the step is bound by launching kernels, 1.001x in
  fp32; in the loop 0.988x (fp32) and 1.06x (fp16); at 1.45x the peak memory (a whole
  block in one construct: 1.6x slower). Across two H200s (1F1B, fp16 as one graph, M=4)
  it measured 1.12-1.18x W per micro-batch: each stage's W, all at the step's end, where
  per micro-batch it ran in 1F1B's order. So pipe defers unless the config says memory is
  short (`recompute`), a layer holds buffers (batch norm: its gradient over all rows would use their joint
  statistics), or a layer with weights is not an nn.Dense and the step is not one stage's
  fp16 graph (fp16 always runs as one graph unless the config says otherwise).
- One graph per step takes away the host's 0.2-0.5 ms per action: 7.9 -> 3.4 ms for the
  small MLP on 2 GPUs, 2x on CPU, and in fp16 the weights are cast once per step, not once
  per action (the large MLP: 66.6 -> 39.1 ms). On one GPU it was as fast as the loop or
  faster at every size measured (4 to 275 GFLOP per action). With messages between stages
  in fp32, where an action is long enough to hide the host, it measured slower (the large
  MLP on 2 GPUs, 69 GFLOP per action: 110 against 85 ms), so there pipe keeps the
  per-action loop. Both ways run the same handlers (pipe.actions), so every feature
  runs in either.
"""
import math

import mindspore as ms
import numpy as np
from mindspore import nn

from pipe.core.wire import elements

__all__ = ["LEFT", "HOST_BOUND_FLOPS", "choose_defer", "is_composite", "is_fp16_graph", "choose_graph",
           "action_flops", "most_of", "announce"]

LEFT = ("defer_wgrad", "one_graph")     # the config fields pipe decides when they are None

# Below this many floating-point operations per action, an fp32 action runs on an H200 in
# about the host's 0.2-0.5 ms per call: the step is host-bound. (Measured on 2 GPUs: 0.13
# GFLOP, the small MLP, one graph 2x faster; 69 GFLOP, the large, one graph slower.)
HOST_BOUND_FLOPS = 1e10


def choose_defer(config, buffers, composite=False):
    """(whether to defer W, why) for `config`; `buffers`: some rank's layers hold buffers;
    `composite`: some rank has a layer with weights that is not an nn.Dense."""
    if config.recompute:
        return False, "W per micro-batch (recompute says memory is short; deferring keeps " \
                      "every micro-batch's activations until the flush)"
    if buffers:
        return False, "W per micro-batch (batch norm: W over all rows would use their joint statistics)"
    if composite and not (is_fp16_graph(config) and config.stages == 1):
        return False, ("W per micro-batch (a layer with weights is not an nn.Dense: deferred, "
                       "its W measured faster on the GPT only on one stage in an fp16 graph)")
    return True, ("W deferred to the flush (every micro-batch's at the step's end, one product per "
                  "layer over all of them)")


def is_composite(layer):
    """A layer with weights whose deferred W measured slower: anything but an nn.Dense."""
    return type(layer) is not nn.Dense and bool(layer.trainable_params())


def is_fp16_graph(config):
    """Whether the step runs as one graph in fp16: always, unless the config says otherwise
    (choose_graph's first rule; choose_defer reads it before the graph is chosen)."""
    return config.precision == "fp16" and config.one_graph is not False


def choose_graph(config, flops):
    """(whether to run the step as one graph, why); `flops`: the most any action computes."""
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
    return False, (f"the per-action loop ({flops / 1e9:.0f} GFLOP per action hides the host's "
                   "cost, and one graph with messages between stages measured slower in fp32 there)")


def action_flops(chunks, specs):
    """The most floating-point operations one F of this rank's chunks computes, counted as
    2 x (vectors in its input) x (its parameters): the products of dense and attention
    layers. A float input (rows, ..., width) has rows x ... vectors; token ids, one each."""
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
