"""pipe.step: a rank's lowered actions as the Steps its handlers read (pipe.actions.encode),
and the one step function, run as the loop and as one graph, training the same bits (in
process; tests/test_transparency.py trains with it on several ranks)."""
import glob
import os
import re
from contextlib import contextmanager

import pytest
from mindspore import nn

from pipe.actions import encode
from pipe.config import PipelineConfig
from pipe.schedule import Action, lower
from pipe.schedules import EVERY, make_schedule


def encoded(*texts):
    """Actions written as "sF0 peer=1 takes=2": kind and micro-batch, then any of chunk,
    peer, takes, puts, message, starts_sum (1)."""
    made = []
    for text in texts:
        head, *fields = text.split()
        kind = head.rstrip("0123456789*")
        mb = head[len(kind):]
        values = {k: int(v) for k, v in (f.split("=") for f in fields)}
        values["starts_sum"] = bool(values.get("starts_sum", 0))
        made.append(Action(kind, EVERY if mb == "*" else int(mb), **values))
    return tuple(made)


def test_1f1b_two_stages_encoded():
    """A tensor in flight is named by its message key, as an integer its wire tag:
    (mb x V + virtual stage taking it) x 2, + 1 for a gradient."""
    schedule = lower(make_schedule("1f1b", 2, 2))
    assert encode(schedule, 0) == encoded(
        "F0 puts=2", "sF0 peer=1 takes=2 message=0",  # input -> F0 -> ("F", 0, 1) -> stage 1
        "F1 puts=6", "sF1 peer=1 takes=6 message=1",
        "rB0 peer=1 puts=1 message=2", "B0 takes=1 starts_sum=1",   # its gradient ("B", 0, 0)
        "rB1 peer=1 puts=5 message=3", "B1 takes=5")
    assert encode(schedule, 1) == encoded(
        "rF0 peer=0 puts=2 message=0", "F0 takes=2",  # the last stage: F0 ends in the loss
        "B0 puts=1 starts_sum=1", "rF1 peer=0 puts=6 message=1",   # B0 from the loss gradient
        "sB0 peer=0 takes=1 message=2", "F1 takes=6",
        "B1 puts=5", "sB1 peer=0 takes=5 message=3")


def test_the_turn_of_a_v_stays_on_its_stage():
    """ZB-V, stage 1 holds virtual stages 1 and 2: F0 writes chunk 1's input (4) and I0:1
    chunk 0's gradient (3), no message between; W sums the weight gradients."""
    program = encode(lower(make_schedule("zb-v", 2, 2, 2)), 1)
    assert program[1:3] == encoded("F0 takes=2 puts=4", "F0 chunk=1 takes=4 puts=6")
    assert set(encoded("I0 chunk=1 takes=5 puts=3", "I0 takes=3 puts=1")) <= set(program)
    assert [s.starts_sum for s in program if s.kind == "W"] == [True, True, False, False]


def test_what_the_loop_runs_one_graph_runs_bitwise():
    """The loop and the graph run the same handlers (pipe.actions): batch norm's buffers
    put back after each backward piece, recompute's second forward, dropout's masks: one
    stage, 1F1B over 4 micro-batches, Adam stepping in the graph, weights, buffers and
    losses bit for bit the loop's. (All three at once here; batch norm with dropout, and
    recompute, as one graph on 2 ranks bitwise the loop: tests/test_models.py's CNN,
    tests/test_recompute.py.)"""
    import mindspore as ms
    import numpy as np

    from pipe.engine import PipelineEngine
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
               for _ in range(3)]
    runs = []
    for one_graph in (False, True):
        ms.set_seed(5)
        layers = [nn.Dense(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(p=0.5), nn.Dense(8, 3)]
        config = PipelineConfig(micro_batches=4, batch_size=8, one_graph=one_graph, defer_wgrad=False,
                                recompute=True)
        engine = PipelineEngine(nn.SequentialCell(layers), nn.SoftmaxCrossEntropyWithLogits(
            sparse=True, reduction="mean"), lambda params: nn.Adam(params, 1e-2), config)
        losses = [engine.train_step(x, y) for x, y in batches]
        runs.append((losses, {n: p.asnumpy() for n, p in engine.parameters_dict().items()}))
    (losses, loop), (graph_losses, graph) = runs
    assert len(loop) == 8               # 2 x (weight, bias) + gamma, beta, mean, variance
    assert losses == graph_losses and all((loop[n] == graph[n]).all() for n in loop)


def test_a_deferred_w_starts_its_chunks_sum():
    """With the weight gradients deferred, I only passes the gradient on; the one W* (all
    micro-batches: EVERY) starts and ends the chunk's sum."""
    program = encode(lower(make_schedule("1f1b", 1, 2, defer_wgrad=True)), 0)
    assert program == encoded("F0", "I0", "F1", "I1", "W* starts_sum=1")


@pytest.mark.parametrize("name,defer_wgrad", [("sgd", False), ("adam", False), ("sgd", True)])
def test_one_stage_as_one_graph_is_bitwise_the_per_action_loop(name, defer_wgrad):
    """1F1B on one stage, 4 micro-batches: B sums each micro-batch's gradients into the
    last (no split backward), inside the graph as the loop does it between calls; the
    optimizer (Adam: and its moments) steps after either.
    Deferred, W* takes the 4 micro-batches' rows at once, cut and joined in the graph.
    (Dropout's masks in the graph: tests/test_transparency.py.)"""
    import mindspore as ms
    from mlp_run import BATCH, LOSS, batches, build_model, optimizer

    from pipe.engine import PipelineEngine
    ms.set_context(mode=ms.PYNATIVE_MODE)
    runs = []
    for one_graph in (False, True):
        config = PipelineConfig(micro_batches=4, batch_size=BATCH, one_graph=one_graph,
                                defer_wgrad=defer_wgrad)
        engine = PipelineEngine(build_model(7), LOSS, optimizer(name), config)
        losses = [engine.train_step(x, y) for x, y in batches(7)]
        runs.append((losses, [p.asnumpy() for p in engine.optimizer.parameters_dict().values()]))
    (losses, loop), (graph_losses, graph) = runs
    assert losses == graph_losses and all((a == b).all() for a, b in zip(loop, graph))


@pytest.fixture(scope="module")
def one_block_plain():
    """One process's run of the GPT's layers, one block, one length (seed 3): ({name:
    value}, every step's loss), the reference of the test below, made once."""
    from gpt_run import ONE_LENGTH, SIZE, plain_run
    return plain_run(3, ONE_LENGTH, dict(SIZE, layers=1))


@pytest.mark.parametrize("micro_batches,defer_wgrad,recompute", [
    (2, True, False), (1, False, False), (2, False, True)])
def test_layers_handing_on_tuples_train_as_one_graph_at_every_micro_batch_count(
        one_block_plain, micro_batches, defer_wgrad, recompute):
    """The GPT example's layers on one stage as one graph, the (sum, count) loss: 2
    micro-batches with W deferred (its rows of each (hidden, mask) argument joined per
    element); one micro-batch with B whole; 2 recomputed (its cells with their own bprop run
    again). All like one process's token mean. (The loop against the graph, bitwise, with
    tuples and W deferred: tests/test_boundary_dtypes.py; new lengths and more blocks:
    tests/test_gpt.py.)"""
    import mindspore as ms
    from gpt_run import BATCH, ONE_LENGTH, SIZE, batches, gpt, optimizer

    from pipe.engine import PipelineEngine
    ms.set_context(mode=ms.PYNATIVE_MODE)
    config = PipelineConfig(micro_batches=micro_batches, batch_size=BATCH, one_graph=True,
                            defer_wgrad=defer_wgrad, recompute=recompute, seed=3)
    engine = PipelineEngine(gpt.gpt_layers(**dict(SIZE, layers=1)), gpt.TokenLoss(), optimizer,
                            config)
    graph_losses = [engine.train_step(x, y) for x, y in batches(3, ONE_LENGTH)]
    graph = {n: p.asnumpy() for n, p in engine.parameters_dict().items()}
    weights, plain_losses = one_block_plain
    assert max(float(abs(graph[n] - weights[n]).max()) for n in weights) < 2e-5
    assert graph_losses == pytest.approx(plain_losses, rel=1e-5)


def test_fp16_on_one_rank_as_one_graph_is_bitwise_the_loop_and_skips_an_overflow():
    """One stage in fp16: after the graph or the loop, the step unscales, checks every
    gradient and steps only if none overflowed (step 3's input overflows)."""
    import mindspore as ms
    from mlp_run import BATCH, FP16_STEPS, LOSS, batches, build_model, optimizer

    from pipe.engine import PipelineEngine
    ms.set_context(mode=ms.PYNATIVE_MODE)
    runs = []
    for one_graph in (False, True):
        config = PipelineConfig(micro_batches=4, batch_size=BATCH, one_graph=one_graph,
                                defer_wgrad=False, precision="fp16", loss_scale=2.0 ** 14)
        engine = PipelineEngine(build_model(7), LOSS, optimizer("adam"), config)
        scales = []
        for x, y in batches(7, steps=FP16_STEPS, overflow=2):
            engine.train_step(x, y)
            scales.append(engine.scaler.value)
        runs.append((scales, [p.asnumpy() for p in engine.optimizer.parameters_dict().values()]))
    (scales, loop), (graph_scales, graph) = runs
    assert scales == graph_scales == [2.0 ** 14] * 2 + [2.0 ** 13] * (FP16_STEPS - 2)
    assert all((a == b).all() for a, b in zip(loop, graph))


def test_weights_keep_their_whole_model_names_in_one_graph(tmp_path):
    """The step graph wraps the chunks' cells again, leaving their parameters' names as
    they are: `parameters_dict()` gives the names MindSpore gives the unsplit model, each
    parameter named so, and `load_parameters` takes a checkpoint of that model back in."""
    import mindspore as ms
    from mlp_run import BATCH, LOSS, batches, build_model, optimizer

    from pipe.engine import PipelineEngine
    ms.set_context(mode=ms.PYNATIVE_MODE)
    engine = PipelineEngine(build_model(7), LOSS, optimizer("sgd"),
                            PipelineConfig(micro_batches=2, batch_size=BATCH, one_graph=True))
    engine.train_step(*batches(7)[0])
    unsplit = build_model(7)
    assert list(engine.parameters_dict()) == list(unsplit.parameters_dict())
    assert all(p.name == name for name, p in engine.parameters_dict().items())   # not renamed
    trained = {name: p.asnumpy() for name, p in engine.parameters_dict().items()}
    ms.save_checkpoint([{"name": n, "data": p} for n, p in engine.parameters_dict().items()],
                       str(tmp_path / "model.ckpt"))
    assert ms.load_param_into_net(unsplit, ms.load_checkpoint(str(tmp_path / "model.ckpt"))) == ([], [])
    fresh = PipelineEngine(build_model(8), LOSS, optimizer("sgd"),
                           PipelineConfig(micro_batches=2, batch_size=BATCH, one_graph=True))
    fresh.load_parameters(ms.load_checkpoint(str(tmp_path / "model.ckpt")))
    assert all((p.asnumpy() == trained[name]).all() for name, p in fresh.parameters_dict().items())


@contextmanager
def saved_graphs(directory):
    """Inside, MindSpore writes under `directory` the kernel graph (`graph_build_*.ir`) of
    each graph it compiles and no other pass's IR (`MS_DEV_DUMP_IR_PASSES`: all of them cost
    more than the compile); yields `files()`, those written so far."""
    import mindspore as ms
    os.environ["MS_DEV_DUMP_IR_PASSES"] = "graph_build"
    ms.set_context(mode=ms.PYNATIVE_MODE, save_graphs=2, save_graphs_path=str(directory))
    try:
        yield lambda: glob.glob(str(directory / "**" / "graph_build_*.ir"), recursive=True)
    finally:
        ms.set_context(save_graphs=0)
        del os.environ["MS_DEV_DUMP_IR_PASSES"]


NODE = re.compile(r"^\s*%(\d+)\S* = (?:PrimFunc_)?(\w+)\((.*?)\)(?: {instance name: \w+})?"
                  r"(?: (?:primitive|cnode)_attrs|$)", re.M)


def step_graph(files):
    """The step's graph (the largest compiled) as its nodes: (number, operator, operands)."""
    return max((NODE.findall(open(path).read()) for path in files()), key=len)


@pytest.mark.parametrize("one_graph", [False, True])
def test_new_dropout_masks_compile_nothing(one_graph, tmp_path):
    """Each step's dropout masks are new tensors, inputs of the compiled calls as variables:
    after the first steps, more steps compile no graph (MindSpore writes one IR file per
    compile; a tuple of tensors passed as a constant compiled every step again)."""
    with saved_graphs(tmp_path) as files:
        engine, x, y = small_engine([nn.Dense(6, 8), nn.ReLU(), nn.Dropout(p=0.5), nn.Dense(8, 3)],
                                    micro_batches=2, one_graph=one_graph, defer_wgrad=False)
        compiled = []
        for _ in range(2):
            engine.train_step(x, y)
            engine.train_step(x, y)
            compiled.append(len(files()))
    assert compiled[0] > 0 and compiled[1] == compiled[0], compiled


@pytest.mark.parametrize("schedule,cell,chunks", [("1f1b", "Backward", 1), ("zb-h1", "WeightGrad", 1),
                                                 ("zb-v", "Forward", 2)])
def test_a_chunks_compiled_pieces_compile_once(schedule, cell, chunks):
    """B, W and F compile once per chunk at M=2 (MindSpore's compile cache gains an entry per
    graph compiled, named by pipe.compiled for the cell it runs): the step's first B (or W)
    starts the gradient sums and the others add to them in a graph of their own
    (`add_grads`), not in a second form of the backward; the shape probe before the first
    step calls the forward as the step does (a chunk before the last takes no labels), so
    the step runs what the probe compiled (ZB-V on one rank: two chunks). Every graph the
    loop compiles is one of pipe.compiled's, or `add_grads`: no piece is called two ways."""
    from mindspore.graph.api import ms_compile_cache
    before = set(ms_compile_cache)
    engine, x, y = small_engine([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3)], micro_batches=2,
                                schedule=schedule, one_graph=False, defer_wgrad=False)
    engine.train_step(x, y)
    compiled = [phase.split("/")[0] for phase in ms_compile_cache - before]
    assert sum(phase.startswith(f"pipe.compiled.{cell}_") for phase in compiled) == chunks, compiled
    assert all(phase.startswith(("pipe.compiled.", "pipe.layers.add_grads.")) for phase in compiled), compiled


def small_engine(layers, loss_fn=None, **config):
    """An engine on one rank over `layers` (6 inputs, 3 classes; SGD; the mean cross-entropy
    unless `loss_fn` says), and a batch of 8."""
    import numpy as np

    from pipe.engine import PipelineEngine
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32)
    engine = PipelineEngine(nn.SequentialCell(layers), loss_fn or nn.SoftmaxCrossEntropyWithLogits(
        sparse=True, reduction="mean"), lambda params: nn.SGD(params, 0.1), PipelineConfig(batch_size=8, **config))
    return engine, x, y


def test_a_prepared_step_runs_what_was_compiled(tmp_path):
    """With other ranks the engine compiles the step before its first call, on every rank at
    once (Step.prepare, the dropout masks keeping every unit): that call then runs what
    was compiled, with this step's masks, and compiles nothing more."""
    from pipe.batch import split
    from pipe.step import Step
    engine, x, y = small_engine([nn.Dense(6, 8), nn.ReLU(), nn.Dropout(p=0.5), nn.Dense(8, 3)],
                                micro_batches=2, one_graph=True, defer_wgrad=False)
    engine.train_step(x, y)
    batch = split(engine.config, x, y, 0)
    built = engine.built[batch.shapes]
    step = Step(built.step.actions, None, one_graph=True)                      # not compiled yet
    with saved_graphs(tmp_path) as files:
        step.prepare(*engine.step_inputs(batch, built, engine.dropout_masks(batch, built.p2p,
                                                                           drawn=False)))
        prepared = len(files())
        step.run(*engine.step_inputs(batch, built, engine.dropout_masks(batch, built.p2p)))
        assert prepared > 0 and len(files()) == prepared, (prepared, len(files()))


@pytest.mark.parametrize("one_graph,counted", [(False, False), (True, False), (True, True)])
def test_a_step_gives_the_losses_the_gradients_and_the_count(one_graph, counted):
    """Run as the loop or as one graph, the step function hands back the losses' sum, the
    weight gradients (one Dense: weight and bias), a token for its messages and the count
    only for a (sum, count) loss."""
    import mindspore as ms
    from mlp_run import TokenLoss

    from pipe.batch import split
    engine, x, y = small_engine([nn.Dense(6, 3)], TokenLoss() if counted else None,
                                one_graph=one_graph)
    engine.train_step(x, y)
    batch = split(engine.config, x, y, 0)
    built = engine.built[batch.shapes]
    loss, grads, sent, count = built.step.run(*engine.step_inputs(
        batch, built, engine.dropout_masks(batch, built.p2p)))
    assert isinstance(loss, ms.Tensor) and [g.shape for g in grads] == [(3, 6), (3,)]
    assert count.asnumpy().tolist() == 8.0 if counted else count == ()


def test_a_fixed_scale_is_a_constant_of_the_graph(tmp_path):
    """fp32 with a scalar loss: the loss gradient's scale, 1 / M, is a number the step's
    graph holds; at M=1 it multiplies nothing, as one process's step. (At M > 1 the
    multiply is there: one graph is bitwise the loop, whose scale is a tensor, above.)"""
    with saved_graphs(tmp_path) as files:
        engine, x, y = small_engine([nn.Dense(6, 3)], one_graph=True, defer_wgrad=False)
        engine.train_step(x, y)
    names = [op for _, op, _ in step_graph(files)]
    assert "Mul" not in names, names


def test_a_deferred_w_runs_no_layer_norm_again(tmp_path):
    """A layer norm's backward kernel gives its input gradient and its weights' gradients
    at once: I keeps the latter and W only adds them up, so with W deferred the step's graph
    runs LayerNorm and LayerNormGrad once per micro-batch, as with W per micro-batch (and
    trains the same weights), not once more over all the rows."""
    import mindspore as ms
    import numpy as np
    counts, weights = {}, {}
    for defer_wgrad in (False, True):
        with saved_graphs(tmp_path / str(defer_wgrad)) as files:
            ms.set_seed(0)
            engine, x, y = small_engine([nn.Dense(6, 8), nn.LayerNorm((8,)), nn.ReLU(), nn.Dense(8, 3)],
                                        micro_batches=2, one_graph=True, defer_wgrad=defer_wgrad)
            engine.train_step(x, y)
        names = [op for _, op, _ in step_graph(files)]
        counts[defer_wgrad] = names.count("LayerNorm"), names.count("LayerNormGrad")
        weights[defer_wgrad] = [p.asnumpy() for p in engine.optimizer.parameters_dict().values()]
    assert counts[False] == counts[True] == (2, 2), counts
    assert all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(weights[False], weights[True]))


def test_a_deferred_w_starts_after_every_input_gradient(tmp_path):
    """Compiled, W waits for the action before (Actions.held): in the step's graph each of
    its kernels (dY^T X, a MatMul of a transposed first operand; a bias's sum over dY)
    reads, through the token, every input gradient product (dY W) of the step. Else a GPU
    runs W's kernels beside the last I, ahead of the send I ends with."""
    with saved_graphs(tmp_path) as files:
        engine, x, y = small_engine([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 8), nn.ReLU(),
                                     nn.Dense(8, 3)], micro_batches=2, one_graph=True,
                                    defer_wgrad=True)
        engine.train_step(x, y)
    nodes = step_graph(files)
    reads = {node: set(re.findall(r"%(\d+)", operands)) for node, _, operands in nodes}

    def before(node):                     # every node `node` reads, directly or not
        seen, todo = set(), [node]
        while todo:
            for operand in reads.get(todo.pop(), ()):
                if operand not in seen:
                    seen.add(operand)
                    todo.append(operand)
        return seen
    products = [(node, operands.split(", ")[2:]) for node, op, operands in nodes if op == "MatMul"]
    weight_grads = [node for node, flags in products if flags == ["Bool(1)", "Bool(0)"]] + [
        node for node, op, _ in nodes if op == "BiasAddGrad"]
    input_grads = {node for node, flags in products if flags == ["Bool(0)", "Bool(0)"]}
    assert len(weight_grads) == 6 and len(input_grads) == 4, (weight_grads, products)
    for node in weight_grads:
        assert input_grads <= before(node), (node, input_grads - before(node))


@pytest.mark.parametrize("schedule", ["1f1b", "zb-v"])
def test_one_graph_runs_each_ranks_list_in_its_order(schedule):
    """Compiled, every action runs after the one before, as the loop runs them: each send
    as soon as its F or B is done, not put off behind the next micro-batch's work (which
    makes the next stage wait), each receive in its place. (A block notes B or I, the
    input gradient; W, which reads what I kept, notes nothing.)"""
    from launch import run_check
    done = run_check("order_check.py", 2, schedule)
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):
        ran = next(line for line in done.outs[rank].splitlines() if " ran: " in line)
        listed = next(line for line in done.outs[rank].splitlines() if "'s list: " in line)
        kinds = [{"I": "B"}.get(a[0], a[0]) for a in listed.split(": ")[1].split() if a[0] != "W"]
        assert ran.split(": ")[1].split() == kinds, (ran, listed)
