"""Tied weights: one weight used on two stages (a tied embedding and output head).

Each rank holding it keeps a copy; the copies start equal (pipe.engine.same_start) and
their gradients are summed over every holder before each step, so they stay equal. Two chunks
of one rank (the V's first and last layers) share one Parameter, stepped once."""
from pipe.features.builders import LayerBuilders
from pipe.partition import whole_model_names

__all__ = ["tied_weights", "sum_copies", "fold_repeats"]


def tied_weights(model, bounds, params, ranks_of_stage):
    """{index in `params`: every rank holding a copy} of each weight that virtual stages on
    several ranks use, in whole-model name order (the same on every rank);
    `ranks_of_stage(vs)` lists the ranks that run virtual stage vs."""
    users = {}
    for vs, (first, last) in enumerate(bounds):
        held = model.held(first, last) if isinstance(model, LayerBuilders) else model[first:last]
        for layer in held:
            for p in layer.trainable_params():
                users.setdefault(id(p), set()).add(vs)
    whole = whole_model_names(model)
    tied = {}
    for k in sorted(range(len(params)), key=lambda k: whole[id(params[k])]):
        stages = users[id(params[k])]
        if len({ranks_of_stage(vs)[0] for vs in stages}) > 1:    # on several ranks of a replica
            tied[k] = tuple(sorted({r for vs in stages for r in ranks_of_stage(vs)}))
    return tied


def fold_repeats(grads, positions, count):
    """The chunks' gradients as one per parameter (`positions[i]`: gradient i's), a weight
    two chunks hold getting the sum of both."""
    folded = [None] * count
    for grad, k in zip(grads, positions):
        folded[k] = grad if folded[k] is None else folded[k] + grad
    return tuple(folded)


def sum_copies(wire, grads, copies):
    """Weight k's gradient summed over `copies[k]`, this replica's ranks holding a copy."""
    grads = list(grads)
    for k, ranks in copies.items():
        grads[k] = wire.all_reduce(grads[k], ranks)
    return tuple(grads)
