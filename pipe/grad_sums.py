"""A chunk's weight gradients summed over the step's micro-batches, the small ones as one vector.

Each backward piece of a micro-batch gives one gradient per weight, and the step adds it to
the chunk's sums: one kernel per weight. On a GPU MindSpore's host takes ~12 us to launch a
kernel whatever its size, while adding a bias of 768 floats takes the device well under
one. The GPT template has 148 weights, 112 of them small: at M=4 its step launched ~450
adds (benchmarks/log.md section 34). So from a step's second gradient on, the gradients of
the weights of at most SMALL elements are kept as one vector: each micro-batch's are
joined into one (a Concat) and added to it (one Add), and the step's sums are cut back
into weights once, at its end (one Split). A large weight's add moves megabytes, where a
launch is noise and a copy into a vector is not: each stays one add. The sums are the
same floats either way: the same additions, element by element, in the same order.

Written once for the loop and the step's graph (pipe.actions): plain Python over constant
tuples, which the compiler unrolls; run one by one, each call below is a compiled one.
"""
import mindspore as ms
from mindspore import ops

from pipe.core.chunk import add_grads, variable

__all__ = ["SMALL", "packing", "with_sums", "weight_by_weight"]

SMALL = 2 ** 20     # elements: such an add takes the device about what a launch takes the host


def packing(params):
    """Where each of `params`' gradients goes, as constants: (the positions of the small
    float32 weights, joined in this order, the others' positions, the small ones' shapes and
    sizes, and for each weight its place: k >= 0 the vector's piece k, else the other
    number -1 - k). With fewer than two small weights there is no vector."""
    small = tuple(i for i, p in enumerate(params) if p.size <= SMALL and p.dtype == ms.float32)
    if len(small) < 2:
        small = ()
    large = tuple(i for i in range(len(params)) if i not in small)
    places = tuple(small.index(i) if i in small else -1 - large.index(i) for i in range(len(params)))
    return (small, large, tuple(params[i].shape for i in small), tuple(params[i].size for i in small),
            places)


def with_sums(sums, grads, first_sum, plan):
    """The sums after a backward piece: its `grads` if they start them (`first_sum`), else
    sums + grads, the small weights' (`plan`, from `packing`) in one vector."""
    if first_sum:
        return grads
    if not plan[0]:
        return add_grads(variable(sums), variable(grads))
    return _add_packed(variable(sums), variable(grads), plan)


@ms.jit
def _add_packed(sums, grads, plan):
    """sums + grads with the small ones joined; the sums still weight by weight (the step's
    first gradients: as long as `grads`) are joined first."""
    if len(sums) == len(grads):
        sums = _packed(sums, plan)
    return add_grads(sums, _packed(grads, plan))


def _packed(grads, plan):
    """(the small weights' gradients as one vector,) + the others', in order."""
    small, large = plan[0], plan[1]
    pieces = ()
    for i in small:
        pieces = pieces + (grads[i].reshape(-1),)
    rest = ()
    for i in large:
        rest = rest + (grads[i],)
    return (ops.cat(pieces),) + rest


def weight_by_weight(sums, plan):
    """The step's sums as one gradient per weight, in the chunk's order."""
    small, large = plan[0], plan[1]
    if len(sums) == len(small) + len(large):     # never joined (one gradient, or no vector)
        return sums
    return _unpacked(variable(sums), plan)


@ms.jit
def _unpacked(sums, plan):
    """The vector cut back into the small weights' gradients, each in its place."""
    shapes, places = plan[2], plan[4]
    pieces = ops.split(sums[0], plan[3])
    grads = ()
    for k in places:
        grads = grads + ((pieces[k].reshape(shapes[k]) if k >= 0 else sums[-k]),)
    return grads
