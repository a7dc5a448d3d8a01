"""PipelineConfig: the one place that resolves defaults and checks values up front."""
import dataclasses
import os
import sys

import pytest

from pipe.config import PipelineConfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from cli import as_flags  # noqa: E402   (examples/cli.py: the programs show fields as flags)


def test_library_errors_name_config_fields_and_programs_show_their_flags():
    with pytest.raises(ValueError) as err:
        PipelineConfig(batch_size=30, data_parallel=2, micro_batches=4).check()
    assert str(err.value) == ("batch_size=30 cannot be split over data_parallel=2 replicas x "
                              "micro_batches=4: it must be a multiple of 8; try batch_size=24")
    shown = as_flags(str(err.value))
    assert shown == ("--batch-size 30 cannot be split over --data-parallel 2 replicas x --micro-batches 4: "
                     "it must be a multiple of 8; try --batch-size 24")
    assert as_flags("drop tf32=True or set one_graph=False") == "drop --tf32 or set --no-one-graph"


def test_interleaved_defaults_to_two_chunks_per_rank():
    assert PipelineConfig(schedule="interleaved-1f1b").chunks_per_stage == 2
    assert PipelineConfig(schedule="1f1b").chunks_per_stage == 1
    assert PipelineConfig(schedule="interleaved-1f1b", chunks_per_stage=3).chunks_per_stage == 3


@pytest.mark.parametrize("config,message", [
    (dict(device="gpu"), "device='gpu' must be 'CPU', 'GPU' or 'Ascend'"),
    (dict(timeout=0), "timeout=0 must be a positive number of seconds"),
    (dict(chunks_per_stage=0), "chunks_per_stage=0 must be a positive integer"),
])
def test_where_and_how_long_to_wait_are_checked_up_front(config, message):
    """A device in lower case would run on the CPU; a timeout of 0 would fail the first wait."""
    with pytest.raises(ValueError) as err:
        PipelineConfig(**config).check()
    assert str(err.value) == message


def test_switches_take_only_true_or_false():
    with pytest.raises(ValueError) as err:
        PipelineConfig(recompute="yes").check()
    assert str(err.value) == "recompute='yes' must be True or False"


@pytest.mark.parametrize("field", ["defer_wgrad", "one_graph"])
def test_what_pipe_may_choose_takes_true_false_or_none(field):
    assert getattr(PipelineConfig(), field) is None          # the default: pipe chooses
    with pytest.raises(ValueError) as err:
        PipelineConfig(**{field: 1}).check()
    assert str(err.value) == f"{field}=1 must be True, False or None (pipe chooses)"


@pytest.mark.parametrize("config,message", [
    (dict(precision="bf16"), "precision='bf16' is not available: MindSpore 2.10 has no bfloat16 "
                             "kernels on CPU or GPU (no bfloat16 Cast on GPU, no bfloat16 MatMul "
                             "on CPU); use precision='fp16' (with loss scaling) or 'fp32'"),
    (dict(precision="half"), "precision='half' must be 'fp32' or 'fp16'"),
    (dict(loss_scale=0.5), "loss_scale=0.5 must be a finite number >= 1"),
    (dict(loss_scale_window=0), "loss_scale_window=0 must be a positive integer"),
    (dict(tf32=1, device="GPU"), "tf32=1 must be True or False"),
    (dict(tf32=True), "tf32=True is an NVIDIA GPU's matrix-product mode, and device='CPU' "
                      "multiplies in float32 whatever it is set to; drop tf32=True or use device='GPU'"),
])
def test_precision_is_checked_up_front(config, message):
    with pytest.raises(ValueError) as err:
        PipelineConfig(**config).check()
    assert str(err.value) == message


# A value other than the default for every config field an example may take as a flag.
FLAG_VALUES = {"stages": "2", "data_parallel": "2", "micro_batches": "2", "batch_size": "8",
               "schedule": "zb-v", "chunks_per_stage": "2", "partition": "parameters", "recompute": None,
               "defer_wgrad": None, "one_graph": None, "timeout": "9", "seed": "5",
               "precision": "fp16", "tf32": None, "clip_grad_norm": "0.5", "device": "GPU"}


@pytest.mark.parametrize("example", [("mnist_train", "mnist"), ("gpt_train", "gpt")])
def test_every_flag_an_example_accepts_reaches_its_config(example):
    """Each flag named after a config field, set to another value than its default, is in
    the config the example trains with (`examples/cli.py`'s `config_from`, which its `train`
    calls)."""
    import inspect

    from launch import load_example
    module = load_example(example[0], example[1], "train.py")
    from cli import config_from       # (examples/cli.py, put on the path by the example)
    assert "config_from(args, device=device)" in inspect.getsource(module.train)
    fields = {f.name for f in dataclasses.fields(PipelineConfig)}
    flags = {a.dest: a.option_strings[0] for a in module.parser()._actions if a.dest in fields}
    assert "one_graph" in flags and "defer_wgrad" in flags and set(flags) <= set(FLAG_VALUES)
    argv = [word for dest, flag in flags.items()
            for word in ([flag] if FLAG_VALUES[dest] is None else [flag, FLAG_VALUES[dest]])]
    args = module.parse_args(argv)
    config = config_from(args, device=args.device)     # (as train resolves "auto")
    for dest in flags:
        assert getattr(config, dest) == getattr(args, dest) != getattr(PipelineConfig(), dest), dest



def test_the_memory_plan_is_set_once_and_a_second_call_changes_nothing():
    """examples/cli.py's plan_memory (use_device's on a GPU; the call itself runs anywhere, in a
    process of its own): MindSpore takes its memory settings once per process and refuses
    a second time, so a second call (or one after a program set its memory itself, the
    same refusal) must leave the first setting and fail nothing."""
    import subprocess
    import sys
    from launch import ROOT
    code = (f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'examples')!r}); "
            "import mindspore as ms; from cli import plan_memory; plan_memory(); "
            "plan_memory(); print(ms.get_context('memory_optimize_level'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stderr[-2000:]
