"""benchmarks/report.py: the table a user reads, with a footnote for what was not measured."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
from report import CPU_NOTE, NOTES, chart, format_table, label, scaling, summarize  # noqa: E402


def row(rank, stage, step_ms, **extra):
    return json.dumps({"layers": 8, "hidden": 1024, "batch_size": 64, "impl": "pipe", "stages": 2,
                       "data_parallel": 1, "schedule": "1f1b", "micro_batches": 4, "rank": rank,
                       "stage": stage, "step_ms": step_ms, "peak_memory_bytes": 2**30, **extra})


def test_a_run_without_its_one_device_baseline_shows_a_dash_and_says_why():
    """The table's main columns, within 100 characters a line; the rest are the CSV's."""
    lines = format_table(summarize([row(0, 0, 8.0, host_us={"F": 250}), row(1, 1, 9.0)])).splitlines()
    assert lines[0].split() == ["model", "layout", "impl", "schedule", "M", "step_ms", "speedup",
                                "bound", "peak_GiB"]
    assert lines[1].split() == ["8x1024", "b64", "2x1", "pipe", "1f1b", "4", "9.00", "-", "1.60",
                                "1.00"]     # (bound: 2 devices x 4 / (4 + 2 - 1))
    assert "\n".join(lines[2:]) == "\n".join(textwrap.fill(NOTES[k], 100) for k in ("columns", "-"))
    assert max(map(len, lines)) <= 100


def test_the_gpt_row_shows_tokens_and_mfu():
    """benchmarks/gpt_benchmark.py's lines: tokens per second from the step, and MFU over
    the devices' peak (2 x 1 TFLOPS here)."""
    gpt = dict(model="gpt", context=512, hidden=768, layers=12, batch_size=16,
               flops_per_step=2e11, peak_tflops=1.0)
    [summary] = summarize([row(0, 0, 200.0, **gpt), row(1, 1, 200.0, **gpt)])
    assert summary["model"] == "GPT 12x768 T512 b16"
    assert (summary["tokens_per_s"], summary["mfu"]) == (16 * 512 / 0.2, 0.5)


def test_a_configuration_run_several_times_shows_its_median_run():
    """Each run's step is its slowest rank's; the table shows the median run's."""
    runs = [(0, 9.0, 8.0), (1, 30.0, 31.0), (2, 10.0, 12.0)]      # (repeat, rank 0, rank 1)
    lines = [row(rank, rank, ms, repeat=r) for r, *ms in runs for rank, ms in enumerate(ms)]
    [summary] = summarize(lines)
    assert (summary["step_ms"], summary["runs"]) == (12.0, 3)


def test_the_headline_compares_with_mindspore_on_one_device_and_charts_every_row(tmp_path):
    """Without pipe's own one-device run, speedup is over MindSpore's compiled step on one
    device; torch's rows sort last; the PNG has a bar per row."""
    lines = [row(0, 0, 16.0, impl="builtin", schedule="builtin", stages=1, micro_batches=1),
             row(0, 0, 8.0), row(1, 1, 10.0),
             row(0, 0, 5.0, impl="torch", schedule="zb-v")]
    rows = summarize(lines)
    assert [(r["layout"], r["impl"], r["speedup"]) for r in rows] == [
        ("1x1", "builtin", 1.0), ("2x1", "pipe", 1.6), ("2x1", "torch", 3.2)]
    assert chart(rows, str(tmp_path / "results.png")) == f"chart: {tmp_path / 'results.png'}"
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chart_names_what_ran_on_one_device():
    """MindSpore's and torch's one-device steps are no pipeline, and the chart says so."""
    lines = [row(0, 0, 16.0, impl="builtin", schedule="builtin", stages=1, micro_batches=1,
                 device="GPU"),
             row(0, 0, 12.0, impl="torch", schedule="-", stages=1, micro_batches=1, device="GPU"),
             row(0, 0, 8.0, device="GPU"), row(1, 1, 10.0, device="GPU")]
    assert [label(r) for r in summarize(lines)] == [
        "MindSpore, one GPU, no pipeline", "torch, one GPU", "pipe (loop) 2x1 1f1b"]


def test_the_gpt_compares_torchs_pipelining_with_torchs_one_device_and_charts_tokens(tmp_path):
    """The GPT's rows: pipe's speedup over MindSpore's one-device step, torch's pipelining's
    over torch's own; the chart plots tokens per second against devices."""
    gpt = dict(model="gpt", context=512, hidden=768, layers=12, batch_size=64,
               flops_per_step=2e11, schedule="1f1b")
    lines = [row(0, 0, 600.0, impl="builtin", stages=1, micro_batches=1, **gpt),
             row(0, 0, 450.0, impl="torch", stages=1, micro_batches=1, **gpt),
             row(0, 0, 400.0, micro_batches=8, **gpt), row(1, 1, 400.0, micro_batches=8, **gpt),
             row(0, 0, 300.0, impl="torch", micro_batches=8, **gpt)]
    rows = summarize(lines)
    assert [(r["layout"], r["impl"], r["speedup"]) for r in rows] == [
        ("1x1", "builtin", 1.0), ("1x1", "torch", 1.0), ("2x1", "pipe", 1.5), ("2x1", "torch", 1.5)]
    assert chart(rows, str(tmp_path / "results.png")) == f"chart: {tmp_path / 'results.png'}"
    assert (tmp_path / "results.png").stat().st_size > 0


def test_the_scaling_charts_bubble_bound_takes_each_layouts_own_micro_batches():
    """With M = 4P, the bound at 2 devices is 2 x 8/9 and at 4 devices 4 x 16/19 of one
    device's tokens per second, each point's own M."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gpt = dict(model="gpt", context=512, hidden=768, layers=12, batch_size=64,
               flops_per_step=2e11, schedule="1f1b")
    lines = [row(0, 0, 600.0, impl="builtin", stages=1, micro_batches=1, **gpt),
             *(row(r, r, 400.0, micro_batches=8, **gpt) for r in range(2)),
             *(row(r, r, 300.0, stages=4, micro_batches=16, **gpt) for r in range(4))]
    rows = summarize(lines)
    fig, ax = plt.subplots()
    scaling(ax, rows[0]["model"], rows)
    bound = [line for line in ax.get_lines() if line.get_linestyle() == "--"][0]
    one = rows[0]["tokens_per_s"]
    assert list(bound.get_xdata()) == [1, 2, 4]
    assert list(bound.get_ydata()) == pytest.approx([one, one * 2 * 8 / 9, one * 4 * 16 / 19])
    assert bound.get_label() == "bubble bound, M = 8, 16"
    plt.close(fig)


def test_on_cpu_the_chart_says_what_its_times_show_and_draws_no_bound(tmp_path, monkeypatch):
    """CPU processes share the cores: the GPT's panel is step times, as the MLP's, with no
    ideal or bubble-bound line to fall short of, and the figure says why."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gpt = dict(model="gpt", context=64, hidden=64, layers=2, batch_size=16, device="CPU",
               flops_per_step=2e9, schedule="1f1b")
    rows = summarize([row(0, 0, 60.0, impl="builtin", stages=1, micro_batches=1, **gpt),
                      row(0, 0, 90.0, micro_batches=8, **gpt), row(1, 1, 90.0, micro_batches=8, **gpt),
                      row(0, 0, 5.0, device="CPU")])
    drawn = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    chart(rows, str(tmp_path / "results.png"))
    [fig] = drawn
    assert fig._suptitle.get_text() == CPU_NOTE
    assert all(not ax.get_lines() for ax in fig.axes)          # bars only: no line to fall
    assert [ax.get_title() for ax in fig.axes] == [
        "8x1024 b64 MLP: step time (ms, median), shorter is faster",
        "GPT 2x64 T64 b16: step time (ms, median), shorter is faster"]


def test_the_pipeline_picture_names_only_the_kinds_of_box_it_draws(tmp_path, monkeypatch):
    """docs/draw_pipeline.py on a 1F1B trace (no W boxes): no "weight grad" in its legend."""
    import importlib.util
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("draw_pipeline", os.path.join(root, "docs", "draw_pipeline.py"))
    draw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(draw)
    events = [{"ph": "M", "pid": 0, "args": {"name": "rank 0"}}] + [
        {"ph": "X", "pid": 0, "name": name, "ts": 10 * i, "dur": 10}
        for i, name in enumerate(["F0", "sF0", "rB0", "B0", "all-reduce"])]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    drawn = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    draw.main([str(tmp_path / "trace.json"), "-o", str(tmp_path / "p.png")])
    [legend] = [ax.get_legend() for ax in drawn[0].axes]
    assert [t.get_text() for t in legend.get_texts()] == [
        "forward", "backward", "all-reduce / optimizer", "send / recv"]


def test_busy_reads_each_ranks_kernel_time_with_nccl_apart(tmp_path):
    """benchmarks/busy.py on MindSpore's GPU profiler files (their real header): the compute
    kernels' time per step, NCCL's apart (a Receive's kernel holds the waiting), rank by rank."""
    header = ("name,type,op_full_name,stream_id,block_dim,grid_dim,occurrences,"
              "total_duration(us),avg_duration(us),max_duration(us),min_duration(us)\n")
    kernels = {0: ['"ncclKernel_SendRecv_RING_SIMPL(ncclDevComm*)",cuLaunchKernel,Default/Send-op1,'
                   '17,"64,1,1","1,1,1",10,9000,900,950,850',
                   '"sm80_xmma_gemm_f32f32(float*)",cuLaunchKernel,Default/MatMul-op3,16,'
                   '"128,1,1","96,1,1",20,30000,1500,1600,1400'],
               1: ['"Softmax<float>(float*)",cuLaunchKernel,Default/Softmax-op2,16,"256,1,1",'
                   '"64,1,1",5,2500,500,510,490']}
    for rank, rows in kernels.items():
        folder = tmp_path / f"vm_{rank}_ascend_ms"
        folder.mkdir()
        (folder / f"gpu_activity_data_{rank}.csv").write_text(header + "\n".join(rows) + "\n")
    done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "busy.py"), str(tmp_path),
                           "--steps", "5"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("rank 0: kernels 6.0 ms a step (4 of them), NCCL's 1.8 ms\n"
                           "rank 1: kernels 0.5 ms a step (1 of them), NCCL's 0.0 ms\n")
