"""How a step runs (pipe.modes): the rules for what the config leaves to pipe, the line a
run starts with, the same modes on every rank, decided before the schedule is made, and
the same training whatever they are."""
import mindspore as ms
import numpy as np
import pytest
from launch import assert_same_bits, load, loop_config, results
from mindspore import nn
from mlp_run import LOSS, build_model, plain_run
from test_transparency import SEED, assert_same_weights, spec

from pipe.config import PipelineConfig
from pipe.engine import PipelineEngine
from pipe.modes import ONE_CALL, Facts, Modes, decide, is_composite
from pipe.schedules import EVERY

DEFERRED = "one product per layer over every micro-batch's rows"
BUFFERS = ("a parameter is not trained (batch norm's statistics, or a frozen weight): one "
           "weight gradient over all rows would mix the statistics")
DENSE = Facts(buffers=False, composite=False)


@pytest.mark.parametrize("config,facts,defer,why", [
    (dict(), {}, True, DEFERRED),
    (dict(recompute=True), {}, False,
     "recompute: deferring would keep every micro-batch's inputs to the end"),
    (dict(), dict(buffers=True), False,
     BUFFERS),
    (dict(precision="fp16"), dict(composite=True), False,
     "a layer with weights is not an nn.Dense: one product over all rows gains on plain "
     "products only"),
])
def test_w_is_deferred_on_plain_products_unless_memory_is_short_or_batch_norm(
        config, facts, defer, why):
    modes = decide(PipelineConfig(one_graph=True, **config), Facts(**{**vars(DENSE), **facts}))
    assert (modes.defer_wgrad, modes.why) == (defer, (why,))


@pytest.mark.parametrize("config,facts", [
    (dict(device="GPU", stages=4), {}),
    (dict(device="GPU", stages=2, precision="fp16"), dict(composite=True)),
    (dict(stages=2), dict(buffers=True)),
    (dict(), {}),
])
def test_one_graph_whatever_the_model_and_the_gpus_unless_the_config_asks_for_the_loop(
        config, facts):
    """By speed alone: the loop and the graph run one step function, so every feature runs
    in both; the config's choice is kept, and nothing said of it."""
    decided = Facts(**{**vars(DENSE), **facts})
    modes = decide(PipelineConfig(defer_wgrad=True, **config), decided)
    assert (modes.one_graph, modes.why) == (True, (ONE_CALL,))
    modes = decide(PipelineConfig(defer_wgrad=True, one_graph=False, **config), decided)
    assert (modes.one_graph, modes.why) == (False, ())


def test_the_modes_read_in_plain_words():
    assert str(Modes(True, True)) == ("the step runs as one compiled graph; weight gradients at "
                                      "the end of the step")
    assert str(Modes(False, False, ("a", "b"))) == (
        "the step runs action by action; weight gradients with each micro-batch's backward "
        "(a; b)")


def test_every_weighted_layer_but_a_dense_is_composite():
    from gpt_run import gpt

    from pipe.layers import leaves
    pieces = leaves([build() for build in gpt.gpt_layers(1, 8, 2, 8, tied=False)])
    assert [(type(p).__name__, is_composite(p)) for p in pieces] == [
        ("Embed", True), ("Norm", True), ("Product", True), ("Attend", False), ("Residual", True),
        ("Norm", True), ("Product", True), ("Gelu", False), ("Residual", True), ("FinalNorm", True),
        ("Logits", True)]
    assert [is_composite(layer) for layer in (nn.Dense(2, 2), nn.ReLU())] == [False, False]


def train(model, config, capsys, steps=3):
    engine = PipelineEngine(model, LOSS, lambda ps: nn.SGD(ps, learning_rate=0.1), config)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        engine.train_step(rng.standard_normal((8, 20)).astype(np.float32),
                          rng.integers(0, 10, 8).astype(np.int32))
    return engine, capsys.readouterr().out


def bn_model():
    ms.set_seed(3)
    return nn.SequentialCell([nn.Dense(20, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dense(8, 10)])


def test_left_to_pipe_a_run_says_its_modes_once_and_trains_as_those_flags_would(capsys):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    chosen, out = train(build_model(SEED), PipelineConfig(micro_batches=2, batch_size=8), capsys)
    assert out == ("pipe: the step runs as one compiled graph; weight gradients at the end of "
                   f"the step ({ONE_CALL}; {DEFERRED})\n")
    assert (chosen.modes.defer_wgrad, chosen.modes.one_graph, chosen.config.defer_wgrad) == (True, True, None)
    forced, quiet = train(build_model(SEED), PipelineConfig(micro_batches=2, batch_size=8,
                                                            defer_wgrad=True, one_graph=True), capsys)
    assert quiet == ""                   # nothing left to pipe: nothing said
    for a, b in zip(chosen.layout.params, forced.layout.params):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_the_schedule_is_made_once_with_the_modes(capsys):
    """Decided before the schedule exists: deferred, each chunk's one W runs over every
    micro-batch (W*) at the flush, in the only schedule the engine ever has."""
    engine, _ = train(build_model(SEED), PipelineConfig(micro_batches=2, batch_size=8), capsys)
    assert [str(a) for a in engine.schedule.actions[0]] == ["F0", "I0", "F1", "I1", "W*"]
    assert engine.layout.schedule is engine.schedule and engine.schedule.actions[0][-1].mb == EVERY


def test_batch_norm_left_to_pipe_runs_w_per_micro_batch_in_one_graph(capsys):
    engine, out = train(bn_model(), PipelineConfig(micro_batches=2, batch_size=8), capsys)
    assert out == ("pipe: the step runs as one compiled graph; weight gradients with each "
                   f"micro-batch's backward ({ONE_CALL}; {BUFFERS})\n")
    assert (engine.modes.defer_wgrad, engine.modes.one_graph, engine.config.one_graph) == (False, True, None)
    looped, _ = train(bn_model(), loop_config(micro_batches=2, batch_size=8), capsys)
    for a, b in zip(engine.layout.params + engine.layout.buffers,
                    looped.layout.params + looped.layout.buffers):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_one_mode_left_to_pipe_is_said_with_its_reason_alone(capsys):
    engine, out = train(build_model(SEED), PipelineConfig(micro_batches=2, batch_size=8,
                                                          one_graph=False), capsys)
    assert out == ("pipe: the step runs action by action; weight gradients at the end of the "
                   f"step ({DEFERRED})\n")
    assert (engine.modes.defer_wgrad, engine.modes.one_graph) == (True, False)


def matrix(root):
    """Runs with nothing pinned (trained in one launch: conftest.trained): a 2 x 2 pipeline
    (and the loop with W deferred, what it chooses but run action by action), and layer
    builders with batch norm on the first stage only."""
    left, zb_v = dict(defer_wgrad=None, one_graph=None), dict(schedule="zb-v", stages=2, data_parallel=2)
    return [(4, spec(root, "defaults-zb-v-2x2", **zb_v, **left)),
            (4, spec(root, "forced-loop-zb-v-2x2", **zb_v, defer_wgrad=True, one_graph=False)),
            (2, {**spec(root, "defaults-batch-norm-builders-2x1", stages=2, **left),
                 "builders": True, "batch_norm": True})]


def test_every_rank_makes_the_same_choice_and_trains_the_one_process_model(trained):
    """ZB-V 2x2: one graph per step (the V's local turn, messages and the replicas'
    all-reduce inside it) with W deferred, every rank's loss and weights the bits of the
    per-action loop's with W deferred, and the single process's model."""
    ranks = results(trained / "defaults-zb-v-2x2")
    assert [(r["defer_wgrad"], r["one_graph"]) for r in ranks.values()] == [(True, True)] * 4
    got, want = (load(trained / name / "model.ckpt") for name in ("defaults-zb-v-2x2", "forced-loop-zb-v-2x2"))
    assert_same_bits(got, want)
    assert [r["losses"] for r in ranks.values()] == \
        [r["losses"] for r in results(trained / "forced-loop-zb-v-2x2").values()]
    assert_same_weights(got, plain_run("sgd", SEED)[0])


def test_batch_norm_on_one_rank_decides_for_every_rank(trained):
    """Builders build each rank's layers alone: rank 1 holds no buffers, yet runs as rank 0
    must (one schedule, one way of running it, on every rank)."""
    ranks = results(trained / "defaults-batch-norm-builders-2x1")
    assert [bool(r["buffers"]) for r in ranks.values()] == [True, False]
    assert [(r["defer_wgrad"], r["one_graph"]) for r in ranks.values()] == [(False, True)] * 2
