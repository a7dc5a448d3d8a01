"""What pipe chooses when the config leaves defer_wgrad and one_graph to it (pipe.fast.defaults):
the rule, the line a run starts with, the same choice on every rank, and the same training."""
import mindspore as ms
import numpy as np
import pytest
from launch import assert_same_bits, load, loop_config, results
from mindspore import nn
from mlp_run import LOSS, build_model, plain_run
from test_transparency import SEED, assert_same_weights, spec

from pipe.config import PipelineConfig
from pipe.engine import PipelineEngine
from pipe.fast.defaults import action_flops, announce, choose_defer, choose_graph, is_composite

DEFERRED = ("W deferred to the flush (every micro-batch's at the step's end, one product per "
            "layer over all of them)")
COMPOSITE = ("W per micro-batch (a layer with weights is not an nn.Dense: deferred, its W "
             "measured faster on the GPT only on one stage in an fp16 graph)")


@pytest.mark.parametrize("config,buffers,composite,choice", [
    (dict(), False, False, (True, DEFERRED)),
    (dict(recompute=True), False, False, (False, "W per micro-batch (recompute says memory is "
                                                 "short; deferring keeps every micro-batch's "
                                                 "activations until the flush)")),
    (dict(), True, False, (False, "W per micro-batch (batch norm: W over all rows would use "
                                  "their joint statistics)")),
    (dict(), False, True, (False, COMPOSITE)),
    (dict(precision="fp16", one_graph=False), False, True, (False, COMPOSITE)),
    (dict(precision="fp16"), False, True, (True, DEFERRED)),
    (dict(precision="fp16", stages=2), False, True, (False, COMPOSITE)),
])
def test_w_is_deferred_unless_memory_is_short_or_a_layer_is_more_than_a_product_outside_one_stages_fp16_graph(
        config, buffers, composite, choice):
    assert choose_defer(PipelineConfig(**config), buffers, composite) == choice


def test_every_weighted_layer_but_a_dense_is_composite():
    from gpt_run import gpt

    from pipe.layers import leaves
    pieces = leaves([build() for build in gpt.gpt_layers(1, 8, 2, 8, tied=False)])
    assert [(type(p).__name__, is_composite(p)) for p in pieces] == [
        ("Embed", True), ("Norm", True), ("Product", True), ("Attend", False), ("Residual", True),
        ("Norm", True), ("Product", True), ("Gelu", False), ("Residual", True), ("FinalNorm", True),
        ("Logits", True)]
    assert [is_composite(layer) for layer in (nn.Dense(2, 2), nn.ReLU())] == [False, False]


@pytest.mark.parametrize("config,facts,choice", [
    (dict(device="GPU"), dict(flops=1.3e8),
     (True, "one graph per step (0.13 GFLOP per action: the host's cost per action would dominate)")),
    (dict(device="GPU", stages=2), dict(flops=6.9e10),
     (False, "the per-action loop (69 GFLOP per action hides the host's cost, and one graph "
             "with messages between stages measured slower in fp32 there)")),
    (dict(device="GPU"), dict(flops=2.75e11),
     (True, "one graph per step (one stage, no messages: as fast as the loop at 275 GFLOP per "
            "action, as measured)")),
    (dict(device="GPU", stages=2), dict(flops=6.9e10, composite=True),
     (True, "one graph per step (two stages of layers that are not nn.Dense: the host issuing "
            "their many kernels per action bounds the loop, as measured)")),
    (dict(device="GPU", stages=4), dict(flops=6.9e10, composite=True),
     (False, "the per-action loop (69 GFLOP per action hides the host's cost, and one graph "
             "with messages between stages measured slower in fp32 there)")),
    (dict(device="GPU", stages=2, precision="fp16"), dict(flops=6.9e10),
     (True, "one graph per step (fp16: the weights are cast once per step, not per action)")),
    (dict(device="CPU", stages=2), dict(flops=6.9e10),
     (True, "one graph per step (on CPU it measured 2x faster than the loop)")),
    (dict(recompute=True), dict(),
     (True, "one graph per step (0.001 GFLOP per action: the host's cost per action would dominate)")),
])
def test_one_graph_unless_fp32_actions_are_long_between_gpus_with_few_kernels(config, facts, choice):
    """By speed alone: the loop and the graph run the same handlers, so every feature runs
    in both (recompute too)."""
    facts = {"flops": 1e6, **facts}
    assert choose_graph(PipelineConfig(**config), **facts) == choice


def test_an_action_counts_two_flops_per_vector_and_parameter():
    class Chunk:
        params = [ms.Parameter(np.zeros((4, 3), np.float32)), ms.Parameter(np.zeros(4, np.float32))]
    # float rows (2, 5, width): 10 vectors; token ids (2, 5): 10 too
    assert action_flops([Chunk()], [((2, 5, 3), ms.float32)]) == 2 * 10 * 16
    assert action_flops([Chunk(), Chunk()], [((2, 5, 3), ms.float32), ((2, 5), ms.int32)]) == 2 * 10 * 16
    assert action_flops([Chunk()], [((7, 3), ms.float16)]) == 2 * 7 * 16


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


def test_left_to_pipe_a_run_says_its_choice_once_and_trains_as_those_flags_would(capsys):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    chosen, out = train(build_model(SEED), PipelineConfig(micro_batches=2, batch_size=8), capsys)
    flops = 2 * 4 * sum(p.size for p in chosen.chunks[0].params)
    assert out == announce([DEFERRED, f"one graph per step ({flops / 1e9:.2g} GFLOP per action: "
                                      "the host's cost per action would dominate)"]) + "\n"
    assert out.startswith("pipe chose W deferred to the flush")
    assert (chosen.defer_wgrad, chosen.one_graph, chosen.config.defer_wgrad) == (True, True, None)
    forced, quiet = train(build_model(SEED), PipelineConfig(micro_batches=2, batch_size=8,
                                                            defer_wgrad=True, one_graph=True), capsys)
    assert quiet == ""                   # nothing left to pipe: nothing said
    for a, b in zip(chosen.layout.params, forced.layout.params):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_batch_norm_left_to_pipe_runs_w_per_micro_batch_in_one_graph(capsys):
    engine, out = train(bn_model(), PipelineConfig(micro_batches=2, batch_size=8), capsys)
    flops = 2 * 4 * sum(p.size for p in engine.chunks[0].params)
    assert out == announce(["W per micro-batch (batch norm: W over all rows would use their "
                            "joint statistics)", f"one graph per step ({flops / 1e9:.2g} GFLOP per "
                            "action: the host's cost per action would dominate)"]) + "\n"
    assert (engine.defer_wgrad, engine.one_graph, engine.config.one_graph) == (False, True, None)
    looped, _ = train(bn_model(), loop_config(micro_batches=2, batch_size=8), capsys)
    for a, b in zip(engine.layout.params + engine.layout.buffers,
                    looped.layout.params + looped.layout.buffers):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_one_choice_left_to_pipe_is_said_alone(capsys):
    engine, out = train(build_model(SEED), PipelineConfig(micro_batches=2, batch_size=8,
                                                          one_graph=False), capsys)
    assert out == announce([DEFERRED]) + "\n"
    assert (engine.defer_wgrad, engine.one_graph) == (True, False)


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
