"""Every dtype a layer may hand on crosses a stage boundary (pipe.wire): float32 and
float16 with their gradients coming back, bool, int32, int64 and uint8 with none, in the
loop and in one graph, 1F1B and ZB-V with W deferred, like one process (tests/dtypes_run.py).
A dtype no wire carries is refused before the first step: tests/test_errors.py."""
import pytest
from dtypes_run import DTYPES, plain_run
from launch import assert_like_one_process, load, results

SEED = 5
CONFIGS = {"1f1b-loop": dict(schedule="1f1b"),
           "1f1b-one-graph": dict(schedule="1f1b", one_graph=True),
           "zb-v-deferred-loop": dict(schedule="zb-v", defer_wgrad=True),
           "zb-v-deferred-one-graph": dict(schedule="zb-v", defer_wgrad=True, one_graph=True)}


def matrix(root):
    return [(2, {"model": "dtypes", "seed": SEED, "save": str(root / f"dtypes-{name}"),
                 "config": {"stages": 2, "micro_batches": 2, **config}})
            for name, config in CONFIGS.items()]


@pytest.fixture(scope="module")
def plain():
    return plain_run(SEED)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_dtype_crosses_a_boundary_and_trains_like_one_process(trained, plain, name):
    crossing = set()
    for result in assert_like_one_process(trained / f"dtypes-{name}", *plain).values():
        crossing |= set(result["crossing"])
    assert crossing == set(DTYPES), crossing


@pytest.mark.parametrize("schedule", ["1f1b", "zb-v-deferred"])
def test_one_graph_trains_the_loops_weights_bit_for_bit(trained, schedule):
    """The step as one graph runs the loop's handlers: with tuples of every dtype between
    the stages (and ZB-V's W deferred over the rows of each element), the same bits."""
    import numpy as np
    loop, graph = (trained / f"dtypes-{schedule}-{mode}" for mode in ("loop", "one-graph"))
    assert [r["losses"] for r in results(loop).values()] == \
        [r["losses"] for r in results(graph).values()]
    loop, graph = load(loop / "model.ckpt"), load(graph / "model.ckpt")
    assert all(np.array_equal(loop[name], graph[name]) for name in loop)


def test_on_gpus_a_dtype_nccl_has_no_kernel_for_is_refused_with_those_it_has():
    """MindSpore's NCCL Send/Receive kernels take float32, float16 and int32 only: on GPUs an
    int64 element is refused before the first step, naming what the layer may hand on
    instead (bool and the narrow ints travel as int32); on CPU (mpi4py) it crosses."""
    import mindspore as ms

    from pipe.ops.handshake import StageCheck, unwired
    from pipe.wire import NCCL_DTYPES, WIRE_DTYPES, Parts
    spec = Parts((((8, 4), ms.float32), ((8,), ms.int64)))
    nccl = set(NCCL_DTYPES)
    assert unwired(spec, nccl) == 1 and unwired(spec, set(WIRE_DTYPES)) is None
    assert unwired(Parts((((8, 4), ms.float16), ((8,), ms.bool_))), nccl) is None
    text = StageCheck([], [(0, 2), (2, 4)], 2, None, nccl).boundary_problem(None, 1, spec)
    assert text.endswith("as Int64, which this wire does not carry; make layer 1 hand it on as "
                         "one of Float32, Float16, Int32, Bool, UInt8, Int8, Int16"), text
