"""What one rank runs: its stage and replica, its schedule, its model chunks.

Every rank builds the same model (same seed), or only its own layers from layer builders,
and keeps the layers of its virtual stages (pipe.schedules places them). Each parameter
and buffer is renamed to its whole-model name (`3.weight`), so checkpoints merge into one
model; a weight used on two stages is found by identity (pipe.features.tied)."""
from dataclasses import dataclass
from functools import cached_property

from pipe.actions import KeepResiduals
from pipe.chunk import Chunk
from pipe.features import dropout, relu
from pipe.features import precision as fp16
from pipe.features.batchnorm import refuse_deferred
from pipe.features.builders import LayerBuilders
from pipe.features.dropout import Masks
from pipe.features.precision import check_layer_precision, to_half
from pipe.features.recompute import Recompute
from pipe.features.token_loss import LossTerm
from pipe.features.tied import tied_weights
from pipe.modes import Modes, decide, facts_of
from pipe.ops.handshake import agreed
from pipe.ops.watchdog import alike_on_every_rank
from pipe.ops.predict import forward_only
from pipe.ops.simulator import checked_schedule
from pipe.partition import check_model, partition, stage_bounds, timed_costs
from pipe.schedules import make_schedule
from pipe.topology import Topology

__all__ = ["Layout", "build_layout", "assemble", "make_chunk", "plan", "distinct_params"]


@dataclass
class Layout:
    config: object       # the PipelineConfig it was built from
    topo: Topology
    rank: int
    schedule: object     # this step's Schedule (lowered: with its messages)
    forward_only: object  # the Schedule predict runs
    all_bounds: list     # [first, last) layers of every virtual stage
    chunks: list         # this rank's Chunk per model chunk
    virtual_stages_held: list    # the virtual stage of each
    bounds: list         # their [first, last) layers
    buffers: list        # their buffers (pipe.layers.buffers_of), each chunk's in turn
    names: list          # per chunk: the whole-model names of its parameters, then buffers
    tied: dict           # index into `params` -> every rank holding a copy of that weight
    keep: object         # what F keeps for the backward (pipe.actions.KeepResiduals)
    modes: Modes         # how the step runs (pipe.modes), decided before the schedule is made

    stage = property(lambda self: self.topo.stage_of(self.rank))      # (derived, not stored)
    replica = property(lambda self: self.topo.replica_of(self.rank))

    @cached_property                     # (the chunks are fixed: read every step)
    def params(self):
        """This rank's parameters, each once (a weight two of its chunks hold: once)."""
        return distinct_params(self.chunks)

    @cached_property
    def repeats(self):
        """Each chunk gradient's index in `params`; None unless two chunks of this rank hold
        one weight (the V's embedding and tied head)."""
        index = {id(p): k for k, p in enumerate(self.params)}
        positions = [index[id(p)] for chunk in self.chunks for p in chunk.params]
        return positions if len(positions) > len(self.params) else None

    @cached_property
    def copies(self):
        """{index in `params`: the ranks of this replica holding a copy} of each tied weight."""
        return {k: tuple(r for r in ranks if self.topo.replica_of(r) == self.replica)
                for k, ranks in self.tied.items()}

    @cached_property
    def norm_once(self):
        """Per parameter: whether this rank adds it to the global gradient norm."""
        return [k not in self.copies or self.rank == min(self.copies[k])
                for k in range(len(self.params))]

    def describe(self):
        """The layout a checkpoint records in its meta.json (resuming may use another)."""
        c = self.config
        return {"stages": c.stages, "data_parallel": c.data_parallel, "schedule": c.schedule,
                "chunks_per_stage": c.chunks_per_stage,
                "bounds": [list(b) for b in self.all_bounds]}


def distinct_params(chunks):
    """The chunks' parameters, each once, in order (a weight two chunks hold: once)."""
    return list({id(p): p for chunk in chunks for p in chunk.params}.values())


def make_chunk(layers, loss_fn=None, is_first=True, first_layer=0, precision="fp32"):
    """A Chunk of `layers` with the features that change what a layer keeps: dropout,
    ReLU, and in fp16 the layers cast (`to_half`) and float32 logits."""
    rules = (dropout, relu)
    if precision == "fp16":
        to_half(layers)
        rules += (fp16,)
    loss = None if loss_fn is None else LossTerm(loss_fn)
    return Chunk(layers, loss, is_first, first_layer, rules, Masks)


def plan(model, loss_fn, config, wire, sample=None):
    """The layout of this process, once the model and the launch are checked; `sample`
    (one micro-batch of inputs) is for partition="time"."""
    if isinstance(model, (list, tuple)):
        model = LayerBuilders(model, config.seed)
        if config.partition in ("parameters", "time"):
            raise ValueError(f"partition={config.partition!r} weighs every layer, which a model "
                             "given as layer builders does not build on every rank; use "
                             "partition='uniform' or explicit layer counts per stage")
    else:
        with alike_on_every_rank():      # every rank, the whole model: all refuse alike
            check_model(model)
            refuse_deferred(config, model.untrainable_params())
    costs = config.partition if config.partition != "time" else \
        timed_costs(model, sample, wire, wire.size)
    # What only this rank builds or checks (its layers) may fail here alone: all fail.
    parts = agreed(wire, lambda: build_layout(model, loss_fn, config, wire.rank, costs))
    return assemble(config, parts, decide(config, facts_of(wire, parts["chunks"])))


def assemble(config, parts, modes):
    """The Layout of `build_layout`'s parts run in `modes`: its schedule made once, with them."""
    P, M, v = config.stages, config.micro_batches, config.chunks_per_stage
    schedule = checked_schedule(config.schedule, P, M, v, modes.defer_wgrad)
    return Layout(config=config, schedule=schedule, modes=modes, **parts)


def build_layout(model, loss_fn, config, rank, costs):
    """The parts of `rank`'s Layout but its schedule and modes: its chunks, split by `costs`
    (a partition method or measured layer costs)."""
    topo = Topology(config.stages, config.data_parallel)
    if isinstance(model, LayerBuilders):
        model.build_tied()
    P, M, v = config.stages, config.micro_batches, config.chunks_per_stage
    schedule = make_schedule(config.schedule, P, M, v)     # where each chunk runs
    V, stage = schedule.virtual_stages, topo.stage_of(rank)
    all_bounds = stage_bounds(model, P, costs, chunks_per_stage=v)
    chunks, bounds, names, held = [], [], [], []
    for c in range(v):
        vs = schedule.virtual_stage(stage, c)
        held.append(vs)
        layers, chunk_names = partition(model, all_bounds[vs])
        for i, layer in enumerate(layers, all_bounds[vs][0]):
            check_layer_precision(i, layer, config.precision)
        chunks.append(make_chunk(layers, loss_fn if vs == V - 1 else None, vs == 0,
                                 all_bounds[vs][0], config.precision))
        bounds.append(all_bounds[vs])
        names.append(chunk_names)
    for chunk, chunk_names in zip(chunks, names):
        for p, name in zip(chunk.state, chunk_names):
            p.name = name        # (the stage's cells renamed it; optimizers want unique names)
    buffers = [b for chunk in chunks for b in chunk.buffers]
    refuse_deferred(config, buffers)
    tied = tied_weights(
        model, all_bounds, distinct_params(chunks),
        lambda vs: [topo.rank_of(schedule.stage_of(vs), r) for r in range(config.data_parallel)])
    keep = Recompute() if config.recompute else KeepResiduals()
    return dict(topo=topo, rank=rank, forward_only=forward_only(schedule), all_bounds=all_bounds,
                chunks=chunks, virtual_stages_held=held, bounds=bounds, buffers=buffers,
                names=names, tied=tied, keep=keep)
