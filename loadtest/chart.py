#!/usr/bin/env python3
"""Chart a run-suite.sh results file: latency percentiles of the fixed-rate fan-out
scenarios, and the ramp's sustained deliveries/s (highest rate with p99 <= 250 ms and
nothing lost), ringcast beside nginx+Nchan (medians over repetitions).

Usage: python3 loadtest/chart.py RESULTS.jsonl [MORE.jsonl ...] OUT.png
With several files, a scenario's runs come from the last file that has that scenario.
Needs matplotlib (pip install matplotlib). Reads only the JSON lines the harness prints.
"""
import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SCENARIOS = ["fanout", "wide", "burst"]
PCTS = [("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99"), ("p999_us", "p99.9")]


def load(paths):
    merged = {}
    for path in paths:
        for key, rs in load_one(path).items():
            merged[key] = rs
    return merged


def load_one(path):
    runs = defaultdict(list)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            if d.get("mode") not in ("fanout", "ramp"):
                continue
            scenario = d.get("label", "").split("/")[0]
            runs[(scenario, d.get("target"))].append(d)
    return runs


def med(values):
    return statistics.median(values) if values else 0.0


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    runs = load(sys.argv[1:-1])
    fig, axes = plt.subplots(1, len(SCENARIOS) + 1, figsize=(18, 4.5))
    for ax, scenario in zip(axes, SCENARIOS):
        width = 0.38
        for i, target in enumerate(["ringcast", "nchan"]):
            rs = runs.get((scenario, target), [])
            ys = [med([r["latency"][k] / 1000.0 for r in rs]) for k, _ in PCTS]
            xs = [j + (i - 0.5) * width for j in range(len(PCTS))]
            ax.bar(xs, ys, width, label=target)
        ax.set_xticks(range(len(PCTS)))
        ax.set_xticklabels([n for _, n in PCTS])
        ax.set_yscale("log")
        ax.set_ylabel("publish-to-delivery latency, ms (log)")
        ax.set_title(scenario)
        ax.legend()
    ax = axes[-1]
    for i, target in enumerate(["ringcast", "nchan"]):
        rs = runs.get(("ramp", target), [])
        y = med([r.get("sustained_deliveries_per_s") or 0 for r in rs])
        ax.bar([i], [y], 0.6, label=target, color=f"C{i}")
        ax.text(i, y, f"{y:,.0f}", ha="center", va="bottom")
    ax.set_xticks([0, 1])
    ax.set_xticklabels(["ringcast", "nchan"])
    ax.set_ylabel("deliveries/s (median of reps)")
    ax.set_title("ramp (10k subs): sustained deliveries/s")
    fig.suptitle("ringcast vs nginx+Nchan, 2 workers each, loopback, 2-core machine (medians)")
    fig.tight_layout()
    fig.savefig(sys.argv[-1], dpi=90)


if __name__ == "__main__":
    main()
