"""Tied weights: one weight used on two stages (a tied embedding and output head).

Each stage holding it keeps a copy; the copies start equal (the same seed), and their
gradients are summed over every rank holding one before every step, so they stay equal.
"""
from pipe.builders import LayerBuilders
from pipe.core.engine import sum_over
from pipe.partition import whole_model_names

__all__ = ["tied_weights", "sum_gradients"]


def tied_weights(model, bounds, params, ranks_of_stage):
    """{index in `params`: every rank holding a copy} for the weights that several stages
    use (a tied embedding and output head). Each copy starts equal (same seed); summing their
    gradients over all copies before every step keeps them equal. They are all-reduced in
    the order of their whole-model names, the same on every rank; `ranks_of_stage(vs)`
    lists the ranks (one per replica) that run virtual stage vs. Every rank checks every
    tied weight of the whole model (given as builders: of every layer built, the tied ones
    among them), so all refuse together."""
    users = {}
    for vs, (first, last) in enumerate(bounds):
        held = model.held(first, last) if isinstance(model, LayerBuilders) else model[first:last]
        for layer in held:
            for p in layer.trainable_params():
                users.setdefault(id(p), set()).add(vs)
    whole = whole_model_names(model)
    for key, stages in users.items():
        holders = {}
        for vs in sorted(stages):
            holders.setdefault(ranks_of_stage(vs)[0], []).append(vs)
        for rank, held in holders.items():
            if len(held) > 1:
                raise ValueError(f"weight {whole[key]!r} is used by virtual stages {held}, all "
                                 f"on rank {rank} (as chunks of its own): pipe keeps a tied "
                                 "weight's copies on different ranks; use a schedule with one "
                                 "chunk per rank, or another partition")
    tied = {}
    for k in sorted(range(len(params)), key=lambda k: whole[id(params[k])]):
        p = params[k]
        if len(users[id(p)]) > 1:
            tied[k] = tuple(sorted({r for vs in users[id(p)] for r in ranks_of_stage(vs)}))
    return tied


def sum_gradients(wire, grads, replica_ranks, tied):
    """`grads` summed over `replica_ranks` as one flat buffer; `tied[k]`: the ranks that
    hold a copy of weight k (its replicas included), summed over those instead."""
    grads = list(grads)
    plain = [k for k in range(len(grads)) if k not in tied]
    for k, summed in zip(plain, sum_over(wire, [grads[k] for k in plain], replica_ranks)):
        grads[k] = summed
    for k, ranks in tied.items():
        grads[k] = wire.all_reduce(grads[k], ranks)
    return tuple(grads)
