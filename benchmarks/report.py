"""Turn the benchmark's JSON lines into one table (printed), plus CSV, JSON and a PNG chart.

    python benchmarks/report.py runs/benchmark/results.jsonl

Per run: step time is the slowest rank's median; a configuration timed in several windows
(`--repeats`) shows the median window, `runs` of them. Memory is the peak per stage
(over replicas and windows).
Speedup is over one device: pipe's own single-device run of the same model and form (one
micro-batch: its fastest), or, where that was not run (the headline table), MindSpore's
compiled step on one device (torch's rows: torch's own step on one device, where it ran);
efficiency divides it by the number of devices. Pipeline
efficiency compares with pipe on a single device running the same M micro-batches, so it
isolates the schedule from the cost of micro-batching; the bound on it is m/(m+p-1) (data
parallelism assumed free). In the CSV: tokens_per_s and mfu are the GPT's (6 N + 12 L T d
FLOPs per token over the devices' dense peak); host_us_per_action is rank 0's median host
microseconds per action kind, issuing the work, not waiting for it.
"""
import csv
import json
import math
import os
import statistics
import sys
import textwrap
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from cli import Parser, existing_file, run  # noqa: E402

COLUMNS = ["model", "layout", "impl", "schedule", "M", "step_ms", "runs", "samples_per_s", "tokens_per_s",
           "mfu", "speedup", "efficiency", "pipeline_eff", "bound", "peak_mem_per_stage_GiB",
           "host_us_per_action"]
SHOWN = ["model", "layout", "impl", "schedule", "M", "step_ms", "speedup", "bound", "peak_GiB"]
DERIVED = ("speedup", "bound")        # from other rows, or "-"
NOTES = {
    "columns": "layout: stages x replicas; schedule W*: every micro-batch's weight gradient at "
               "the flush; speedup: over one device's step; bound: P x D x M / (M + P - 1), the "
               "speedup that 1F1B's bubble allows; peak_GiB: the largest stage's peak memory. Every "
               "column (samples and tokens per second, MFU, efficiencies, memory per stage, "
               "the host's time per action) is in the CSV beside the PNG",
    "-": "-: not measured in these results (speedup needs a one-device run of the same model: "
         "--all; the built-in has no bound)",
}


def host_line(ranks):
    """Rank 0's median host microseconds per action kind ("F 310 B 420 ..."): issuing the
    work, not waiting for it; the part of a small model's step that the device cannot hide."""
    host = next((r.get("host_us") for r in ranks if r["rank"] == 0), None)
    return " ".join(f"{kind} {us}" for kind, us in host.items()) if host else "-"


def model_name(row):
    """What a row's model is called in the table: `8x1024 b64`, or `GPT 12x768 T512 b16`."""
    size = f"{row['layers']}x{row['hidden']}"
    if row.get("model") == "gpt":
        size = f"GPT {size} T{row['context']}"
    precision = row.get("precision", "fp32")
    return f"{size} b{row['batch_size']}" + (f" {precision}" if precision != "fp32" else "")


def summarize(lines):
    runs = defaultdict(list)
    for line in lines:
        row = json.loads(line)
        key = (model_name(row), row["batch_size"], row["impl"], row["stages"], row["data_parallel"],
               row["schedule"], row["micro_batches"])
        runs[key].append(row)
    rows = []
    for (model, batch, impl, P, D, schedule, M), ranks in runs.items():
        repeats = defaultdict(list)
        for r in ranks:
            repeats[r.get("repeat", 0)].append(r["step_ms"])
        step = statistics.median(max(times) for times in repeats.values())
        memory = defaultdict(int)
        for r in ranks:
            memory[r["stage"]] = max(memory[r["stage"]], r["peak_memory_bytes"])
        deferred = ranks[0].get("defer_wgrad", False)
        first = ranks[0]                 # the GPT's: tokens and FLOPs per step, the peak
        tokens = batch * first["context"] / step * 1e3 if "context" in first else math.nan
        mfu = first["flops_per_step"] / (step / 1e3) / (first["peak_tflops"] * 1e12 * P * D) \
            if first.get("peak_tflops") else math.nan
        rows.append({"model": model, "layout": f"{P}x{D}", "impl": impl,
                     "schedule": schedule if P > 1 else "W*" if deferred else "-", "M": M,
                     "step_ms": step, "runs": len(repeats), "samples_per_s": batch / step * 1e3,
                     "tokens_per_s": tokens, "mfu": mfu,
                     "devices": P * D, "P": P, "device": first.get("device", "device"),
                     "deferred": deferred,
                     "peak_mem_per_stage_GiB": " ".join(f"{memory[s] / 2**30:.2f}" for s in sorted(memory)),
                     "peak_GiB": max(memory.values()) / 2**30,
                     "host_us_per_action": host_line(ranks)})
    def single(row, micro_batches, impls):    # one device, the first of `impls` run
        for impl in impls:
            found = [r["samples_per_s"] for r in rows if r["model"] == row["model"]
                     and r["impl"] == impl and r["devices"] == 1 and r["M"] == micro_batches
                     and (impl == "builtin" or r["deferred"] == row["deferred"])]
            if found:
                return found[0]
        return float("nan")
    for row in rows:                      # pipe's one device run the same way (graph or not,
        same = ["pipe-graph" if row["impl"] == "pipe-graph" else "pipe"]  # W deferred or not);
        own = ["torch"] if row["impl"] == "torch" else []   # torch's over torch's one device
        row["speedup"] = row["samples_per_s"] / single(row, 1, own + same + ["builtin"])
        row["efficiency"] = row["speedup"] / row["devices"]
        row["pipeline_eff"] = row["samples_per_s"] / single(row, row["M"], same) / row["devices"]
        row["bound"] = (row["devices"] * row["M"] / (row["M"] + row["P"] - 1)
                        if row["impl"] != "builtin" else float("nan"))
    order = {"pipe": 0, "pipe-graph": 1, "builtin": 2, "torch": 3}
    rows.sort(key=lambda r: (r["model"], r["devices"], r["layout"], order[r["impl"]], r["schedule"]))
    return rows


def cell(value, column=""):
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.1%}" if column == "mfu" else \
            f"{value:.0f}" if column == "tokens_per_s" else f"{value:.2f}"
    return str(value)


def format_table(rows):
    """The table's main columns (the CSV has them all), then a footnote for each kind of
    entry that needs one; within 100 columns."""
    table = [SHOWN] + [[cell(r[c], c) for c in SHOWN] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(SHOWN))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in table]
    notes = [NOTES["columns"]] + [NOTES["-"]] * any(cell(r[c]) == "-" for r in rows for c in DERIVED)
    return "\n".join(lines + [textwrap.fill(note, 100) for note in notes])


NAMES = {"pipe": "pipe (loop)", "pipe-graph": "pipe (one graph)", "builtin": "MindSpore built-in",
         "torch": "torch pipelining"}
ALONE = {"builtin": "MindSpore, one {device}, no pipeline", "torch": "torch, one {device}"}


def label(row):
    """What a chart's bar says ran: on one device MindSpore's or torch's own step is no
    pipeline, and says so."""
    if row["devices"] == 1 and row["impl"] in ALONE:
        return ALONE[row["impl"]].format(device=row["device"])
    schedule = row["schedule"] if row["schedule"] != "-" else ""
    return f"{NAMES[row['impl']]} {row['layout']} {schedule}".rstrip()


def chart(rows, path):
    """One panel per model: a horizontal bar per row, step time; for the GPT, tokens per
    second against the number of devices for pipe (from MindSpore's one-device step) and
    torch (from its own), with the ideal and 1F1B's bubble bound. Needs matplotlib
    (optional: pip install matplotlib). Returns what it did, as a line to print."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib is not importable (pip install matplotlib, then run this again)"
    models = sorted({r["model"] for r in rows})
    cpu = all(r["device"] == "CPU" for r in rows)
    fig, axes = plt.subplots(len(models), 1, squeeze=False,
                             figsize=(9, 1.2 + 0.35 * len(rows) + 1.2 * len(models) + cpu))
    for ax, model in zip(axes[:, 0], models):
        mine = [r for r in rows if r["model"] == model]
        if model.startswith("GPT") and not cpu:
            scaling(ax, model, mine)
        else:
            bars(ax, model, mine)
    if cpu:                              # processes sharing cores: no speedup to draw
        fig.suptitle(CPU_NOTE, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"chart: {path}"


CPU_NOTE = ("On CPU the processes share this machine's cores: these runs show each schedule at work\n"
            "and every layout training the same model, not what pipelining gains (a time here also\n"
            "counts the cores one process leaves idle); that needs one GPU per stage")


def bars(ax, model, mine):
    colors = {"pipe": "#4c8bd6", "pipe-graph": "#4c8bd6", "builtin": "#9a6fc4", "torch": "#f0a030"}
    ax.barh([label(r) for r in mine], [r["step_ms"] for r in mine],
            color=[colors[r["impl"]] for r in mine])
    for y, r in enumerate(mine):
        ax.text(r["step_ms"], y, f" {r['step_ms']:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    kind = "" if model.startswith("GPT") else " MLP"
    ax.set_title(f"{model}{kind}: step time (ms, median), shorter is faster", fontsize=10)
    ax.margins(x=0.15)


def scaling(ax, model, mine):
    """Tokens per second against devices: pipe's line starts at MindSpore's one-device step,
    torch's at torch's; the ideal and the bubble bound scale MindSpore's point."""
    lines = {"pipe": ("builtin", ("pipe", "pipe-graph"), "#4c8bd6"),
             "torch pipelining": ("torch", ("torch",), "#f0a030")}
    for name, (alone, pipelined, color) in lines.items():
        points = sorted((r["devices"], r["tokens_per_s"]) for r in mine
                        if (r["devices"] == 1 and r["impl"] == alone)
                        or (r["devices"] > 1 and r["impl"] in pipelined))
        if points:
            ax.plot(*zip(*points), "o-", color=color, label=name)
    base = [r for r in mine if r["devices"] == 1 and r["impl"] == "builtin"]
    piped = [r for r in mine if r["devices"] > 1 and r["impl"] in ("pipe", "pipe-graph")]
    if base and piped:
        one, m = base[0]["tokens_per_s"], {1: 1} | {r["devices"]: r["M"] for r in piped}
        n = sorted(m)                    # (each point's bound at its own M)
        ax.plot(n, [one * k for k in n], ":", color="grey", label="ideal")
        ax.plot(n, [one * k * m[k] / (m[k] + k - 1) for k in n], "--", color="grey",
                label="bubble bound, M = " + ", ".join(str(m[k]) for k in n[1:]))
    ax.set_xticks(sorted({r["devices"] for r in mine}))
    ax.set_xlabel("devices")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{model}: tokens per second, higher is faster", fontsize=10)
    ax.legend(fontsize=8)


def main(path):
    try:
        with open(path) as f:
            rows = summarize(f)
    except (ValueError, KeyError, TypeError) as e:       # not JSON lines, or not results
        raise ValueError(f"{path} is not the JSON lines a benchmark writes ({type(e).__name__}: "
                         f"{e}): give the results.jsonl of a benchmark run") from None
    if not rows:
        raise ValueError(f"{path} holds no results: give the results.jsonl of a benchmark run")
    print(format_table(rows))
    stem = path.rsplit(".", 1)[0]
    print(chart(rows, stem + ".png"))
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    with open(stem + ".json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    parser = Parser(description="The benchmark's results as one table, CSV, JSON and PNG.")
    parser.add_argument("results", type=existing_file, help="the JSON lines benchmark.py wrote")
    run(lambda: main(parser.parse_args().results))
