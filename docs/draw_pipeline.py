"""Draw a recorded pipeline trace as a Gantt chart: one row per rank, a box per action.

    python docs/draw_pipeline.py TRACE.json -o docs/pipeline.png [--title TEXT]

Forward boxes are blue, backward orange, weight-gradient green, sends/receives thin grey,
the all-reduce and optimizer step purple; the micro-batch number is written in each box.
White space between boxes is the bubble.
"""
import json
import os
import re
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from cli import Parser, existing_file, run  # noqa: E402

COLORS = {"F": "#4c8bd6", "B": "#f0a030", "W": "#5bb55b", "all-reduce": "#9a6fc4", "optimizer": "#9a6fc4"}
LEGEND = [("forward", ["F"]), ("backward", ["B"]), ("weight grad", ["W"]),
          ("all-reduce / optimizer", ["all-reduce", "optimizer"]), ("send / recv", ["wire"])]


def load(path):
    """The trace's rank names and spans; a file that is not a trace pipe recorded is refused."""
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        spans = [e for e in events if e["ph"] == "X" and e["pid"] in names]
    except (ValueError, KeyError, TypeError):    # not JSON, or not a trace
        spans = []
    if not spans:
        raise ValueError(f"{path} holds no span of a Chrome trace that pipe recorded: give one "
                         "that `benchmarks/benchmark.py --trace STEM` wrote")
    return names, spans


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("trace", type=existing_file)
    p.add_argument("-o", "--output", default="docs/pipeline.png")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    names, spans = load(args.trace)
    t0 = min(e["ts"] for e in spans)
    ranks = sorted(names)
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(ranks) + 1.4))
    drawn = set()                        # the legend names only the kinds drawn
    for e in spans:
        row = ranks.index(e["pid"])
        start, width = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
        compute = re.fullmatch(r"([FBW])(\d+)(?::\d+)?", e["name"])
        kind = compute[1] if compute else e["name"] if e["name"] in COLORS else "wire"
        drawn.add(kind)
        if kind != "wire":
            ax.barh(row, width, left=start, height=0.8, color=COLORS[kind], edgecolor="black", linewidth=0.4)
            if compute:
                ax.text(start + width / 2, row, compute[2], ha="center", va="center", fontsize=7)
        else:  # a send or receive: how long the rank waited on the wire
            ax.barh(row, width, left=start, height=0.25, color="#bbbbbb")
    ax.set_yticks(range(len(ranks)), [names[r] for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(args.title or args.trace)
    shown = [(label, COLORS.get(kinds[0], "#bbbbbb")) for label, kinds in LEGEND if drawn & set(kinds)]
    ax.legend([plt.Rectangle((0, 0), 1, 1, color=c) for _, c in shown], [label for label, _ in shown],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(shown), fontsize=8,
              frameon=False)
    fig.tight_layout()
    fig.savefig(args.output, dpi=130)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    run(main)
