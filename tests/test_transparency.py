"""Pipelined training equals single-process training: same weights, same loss on every rank.

The reference is MindSpore's own TrainOneStepCell on the whole batch, in this process. The
pipelines drive `PipelineEngine` directly (tests/mlp_run.py), as real processes started by
mpiexec, all layouts in one launch (conftest.trained, tests/mpi_worker.py), on the CPU wire.
"""
import os

import numpy as np
import pytest
from launch import assert_same_bits, load, results
from mlp_run import build_model, plain_run

SEED = 7
LAYOUTS = [(1, 2), (2, 1), (2, 2), (3, 1), (4, 1)]
CASES = [("1f1b", p, d) for p, d in LAYOUTS] + [("gpipe", 2, 2)]
BUILDER_LAYOUTS = [(1, 1, "1f1b"), (2, 1, "1f1b"), (4, 1, "zb-h1"), (2, 2, "interleaved-1f1b")]
WHOLE_ON_EVERY_RANK = ("1f1b", 4, 1)   # the whole model given: every rank holds it all


def spec(root, name, optimizer="sgd", **config):
    config = {"micro_batches": 4, **config}
    return {"config": config, "optimizer": optimizer, "seed": SEED, "save": str(root / name)}


def matrix(root):
    """Every pipeline this module checks (trained in one launch: conftest.trained)."""
    configs = [(p * d, {**spec(root, f"{s}-{p}x{d}", schedule=s, stages=p, data_parallel=d),
                        "count_held": (s, p, d) == WHOLE_ON_EVERY_RANK}) for s, p, d in CASES]
    configs += [(p * d, {**spec(root, f"builders-{p}x{d}", schedule=s, stages=p, data_parallel=d),
                         "builders": True, "count_held": True}) for p, d, s in BUILDER_LAYOUTS]
    configs += [(4, {**spec(root, "adam-2x2", "adam", stages=2, data_parallel=2),
                     "replica_seeds": True, "frozen": True}),
                (2, {**spec(root, "dropout-adam-2x1", "adam", stages=2), "dropout": True}),
                (2, {**spec(root, "one-graph-dropout-adam-2x1", "adam", stages=2, one_graph=True),
                     "dropout": True}),
                (4, spec(root, "zb-v-2x2", schedule="zb-v", stages=2, data_parallel=2)),
                (4, spec(root, "dualpipe-v-2x2", schedule="dualpipe-v", stages=2, data_parallel=2)),
                (4, {**spec(root, "defer-wgrad-zb-v-2x2", "adam", schedule="zb-v", stages=2,
                            data_parallel=2, defer_wgrad=True), "padded": True}),
                (1, spec(root, "gpipe-1x1", schedule="gpipe")),
                (3, {**spec(root, "weightless-stage-3x1", "adam", stages=3, partition=[1, 1, 5]),
                     "flat": True}),
                (2, {**spec(root, "time-2x1", stages=2, partition="time"), "padded": True})]
    return configs


@pytest.fixture(scope="module")
def runs(trained):
    """Every pipeline's saved weights and every rank's losses."""
    names = {os.path.basename(spec["save"]) for _, spec in matrix(trained)}
    return {name: (load(trained / name / "model.ckpt"), results(trained / name)) for name in names}


@pytest.fixture(scope="module")
def plain():
    return {"sgd": plain_run("sgd", SEED), "adam": plain_run("adam", SEED),
            "builders": plain_run("sgd", SEED, builders=True),
            "padded-sgd": plain_run("sgd", SEED, padded=True),
            "padded-adam": plain_run("adam", SEED, padded=True),
            "frozen-adam": plain_run("adam", SEED, frozen=True)}


def assert_same_weights(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("schedule,stages,data_parallel", CASES)
def test_pipeline_equals_single_process(runs, plain, schedule, stages, data_parallel):
    assert_same_weights(runs[f"{schedule}-{stages}x{data_parallel}"][0], plain["sgd"][0])


def test_one_stage_equals_single_process(runs, plain):
    assert_same_weights(runs["gpipe-1x1"][0], plain["sgd"][0])


def test_time_balanced_partition_equals_single_process(runs, plain):
    """Every rank times the layers, the mean decides the split: the ranks must agree (with
    a (sum, count) loss: test_a_sum_and_count_loss_is_the_whole_batch_token_mean)."""
    assert_same_weights(runs["time-2x1"][0], plain["padded-sgd"][0])


def test_zb_v_with_data_parallelism_equals_single_process(runs, plain):
    """Two chunks per rank in a V (rank 1 hands its chunk 0's output to its chunk 1), two
    replicas all-reducing both chunks' gradients."""
    assert_same_weights(runs["zb-v-2x2"][0], plain["sgd"][0])


def test_dualpipe_v_with_data_parallelism_equals_single_process(runs, plain):
    """DualPipeV's W waits in a queue across chunks and micro-batches; both replicas'
    accumulated gradients still sum to the whole batch's."""
    assert_same_weights(runs["dualpipe-v-2x2"][0], plain["sgd"][0])


@pytest.mark.parametrize("stages,data_parallel,schedule", BUILDER_LAYOUTS)
def test_layer_builders_train_like_one_process(runs, plain, stages, data_parallel, schedule):
    """Each rank builds only its own layers, each seeded by (seed, layer index): every
    layout starts from, and trains, the model one process builds from the same builders."""
    assert_same_weights(runs[f"builders-{stages}x{data_parallel}"][0], plain["builders"][0])


def test_each_rank_builds_only_its_layers(runs):
    """Model parameters alive per rank (elements): the 4 blocks are 672, 1056, 1056 and 330;
    given the whole nn.SequentialCell, every rank holds all 3114."""
    held = lambda name: [r["parameters_held"] for _, r in sorted(runs[name][1].items())]
    assert held("builders-1x1") == [3114]
    assert held("builders-2x1") == [672 + 1056, 1056 + 330]
    assert held("builders-4x1") == [672, 1056, 1056, 330]
    assert held("builders-2x2") == [672 + 1056, 1056 + 330] * 2    # interleaved: blocks 0+2, 1+3
    assert held("{}-{}x{}".format(*WHOLE_ON_EVERY_RANK)) == [3114] * 4


def test_adam_pipeline_equals_single_process_though_replica_1_built_other_weights(runs, plain):
    """Replica 1 built its model from another seed (as a model built unseeded does), its
    frozen first layer too: it starts from replica 0's weights, trained or not
    (pipe.engine.same_start), so both train one model."""
    assert_same_weights(runs["adam-2x2"][0], plain["frozen-adam"][0])


def test_a_stage_without_weights_trains_as_one_process(runs, plain):
    """Stage 1 holds one ReLU: no weights, so no optimizer (MindSpore's refuse none) and no
    optimizer state to save; the stages around it train and resume as one process."""
    flat = {f"{2 * int(name.split('.')[0])}.{name.split('.')[-1]}": value   # 1.0.weight: 2.weight
            for name, value in plain["adam"][0].items()}
    assert_same_weights(runs["weightless-stage-3x1"][0], flat)


def test_deferred_weight_gradients_equal_single_process(runs, plain):
    """Each chunk's W once per step over its replica's 4 micro-batches (defer_wgrad), in
    ZB-V's V with two replicas, under Adam (and a (sum, count) loss): the whole batch's
    gradient, every rank's loss."""
    got, results = runs["defer-wgrad-zb-v-2x2"]
    assert_same_weights(got, plain["padded-adam"][0])
    for result in results.values():
        np.testing.assert_allclose(result["losses"], plain["padded-adam"][1], rtol=1e-6)


def test_one_graph_with_dropout_and_adam_is_bitwise_the_loop(runs):
    """Each rank's dropout masks (drawn on the host, stage 1's for its received
    activations) go in with the micro-batches; Adam steps after the graph. Weights and
    losses: the per-action loop's, bit for bit."""
    (got, results), (want, loop) = runs["one-graph-dropout-adam-2x1"], runs["dropout-adam-2x1"]
    assert_same_bits(got, want)
    assert [r["losses"] for r in results.values()] == [r["losses"] for r in loop.values()]


def test_weights_moved(plain):
    """Guards the test itself: training really changed the weights."""
    start = {n: p.asnumpy() for n, p in build_model(SEED).parameters_and_names()}
    assert max(np.abs(plain["sgd"][0][k] - start[k]).max() for k in start) > 1e-3


@pytest.mark.parametrize("stages,data_parallel", [(4, 1), (2, 2)])
def test_every_rank_returns_the_single_process_loss(runs, plain, stages, data_parallel):
    """The step's loss lives on the last stages; every rank must return it, bitwise the same."""
    got = {rank: result["losses"] for rank, result in runs[f"1f1b-{stages}x{data_parallel}"][1].items()}
    assert sorted(got) == list(range(stages * data_parallel))
    assert all(got[r] == got[0] for r in got)
    np.testing.assert_allclose(got[0], plain["sgd"][1], rtol=1e-6)


@pytest.mark.parametrize("name,optimizer", [("time-2x1", "sgd"), ("defer-wgrad-zb-v-2x2", "adam")])
def test_a_sum_and_count_loss_is_the_whole_batch_token_mean(runs, plain, name, optimizer):
    """loss_fn returns (summed loss over non-padding targets, their count); micro-batches
    hold different counts. The step's gradient and loss are one process's token mean over
    the whole batch (total sum / total count), not the mean of micro-batch means: 1F1B 2x1
    (time-balanced), and ZB-V with two replicas and deferred W."""
    got, results = runs[name]
    assert_same_weights(got, plain["padded-" + optimizer][0])
    for result in results.values():
        np.testing.assert_allclose(result["losses"], plain["padded-" + optimizer][1], rtol=1e-6)
