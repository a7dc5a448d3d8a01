"""What one rank holds: its model chunks, their whole-model names, the weights it shares.

Every rank builds the same full model (same seed) and keeps the layers of its virtual
stages (with v chunks per rank, rank r holds virtual stages r, P + r, ...: pipe.schedule).
Each parameter and buffer is renamed to its whole-model name (`3.weight`), so checkpoints
from every rank merge into one model; a weight used on two stages (a tied embedding and
output head) is found by identity and listed with the ranks that hold a copy.
"""
from dataclasses import dataclass

from pipe.partition import partition, stage_bounds, tied_weights
from pipe.stage import Stage

__all__ = ["Layout", "build_layout"]


@dataclass
class Layout:
    all_bounds: list     # [first, last) layers of every virtual stage
    chunks: list         # this rank's Stage per model chunk
    bounds: list         # their [first, last) layers
    names: list          # per chunk: the whole-model names of its parameters, then buffers
    tied: dict           # index into `params` -> every rank holding a copy of that weight

    @property
    def params(self):
        return [p for chunk in self.chunks for p in chunk.params]

    @property
    def buffers(self):
        return [b for chunk in self.chunks for b in chunk.buffers]


def build_layout(model, loss_fn, config, schedule, topo, stage, costs):
    """The chunks of pipeline stage `stage` under `schedule`, split by `costs` (a partition
    method or measured layer costs). Each chunk scales its loss gradient by 1/(M x D): the
    gradients summed over M micro-batches and D replicas are then the mini-batch mean."""
    V = schedule.virtual_stages
    all_bounds = stage_bounds(model, V, costs)
    scale = 1.0 / (config.micro_batches * config.data_parallel)
    chunks, bounds, names = [], [], []
    for c in range(config.virtual_stages):
        vs = schedule.virtual_stage(stage, c)
        layers, chunk_names = partition(model, V, vs, costs)
        chunks.append(Stage(layers, loss_fn if vs == V - 1 else None, is_first=vs == 0,
                            grad_scale=scale, recompute=config.recompute,
                            first_layer=all_bounds[vs][0]))
        bounds.append(all_bounds[vs])
        names.append(chunk_names)
    for chunk, chunk_names in zip(chunks, names):
        for p, name in zip(chunk.state, chunk_names):
            p.name = name        # the stage's wrapper cells renamed it; optimizers want unique names
    params = [p for chunk in chunks for p in chunk.params]
    tied = tied_weights(model, all_bounds, params, [p.name for p in params], lambda vs: [
        topo.rank_of(schedule.rank_of(vs), r) for r in range(config.data_parallel)])
    return Layout(all_bounds, chunks, bounds, names, tied)
