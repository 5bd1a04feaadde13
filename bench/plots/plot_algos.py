#!/usr/bin/env python3
"""Plot and table of the algorithm sweep (bench/drivers/algo_sweep.sh).

usage: bench/plots/plot_algos.py SWEEP_CSV OUT_PNG LABEL [--caption TEXT]

Reads rows "ranks,round,algo,size_bytes,time_us,busbw_GBps,ran"; per (ranks, algo, size) keeps
the best round; drops forced rows where another algorithm ran (a size limit). Draws time and
busbw against size, one column per world size, with the crossovers of the best forced algorithm
marked; prints the markdown table: each algorithm's time, the best forced one, the tuner's pick,
and two ratios to the best: the pick's own forced time (the choice's quality, free of the noise
between two runs of one algorithm) and the tuner's run itself (the bar: within 10%). The plot's caption names the machine, date
and version: by default this machine's, today and this checkout's (bench/plots/plot_caption.py);
--caption gives the measuring run's when the plot is redrawn from a CSV in docs/.
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_caption  # noqa: E402


def human(b):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return str(b)


def us(t):
    return f"{t:.2f}" if t < 10 else f"{t:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("label")
    ap.add_argument("--caption", default=None)
    a = ap.parse_args()
    path, png, label = a.csv, a.png, a.label
    caption = a.caption or plot_caption.default_caption()
    best = {}  # (n, algo, size) -> (time_us, busbw, ran)
    with open(path) as f:
        for row in csv.DictReader(f):
            n, algo, size = int(row["ranks"]), row["algo"], int(row["size_bytes"])
            if algo != "tuner" and row["ran"] != algo:
                continue
            t, bw = float(row["time_us"]), float(row["busbw_GBps"])
            key = (n, algo, size)
            if key not in best or t < best[key][0]:
                best[key] = (t, bw, row["ran"])
    ns = sorted({k[0] for k in best})
    algos = []
    for k in best:
        if k[1] not in algos:
            algos.append(k[1])
    forced = sorted(a for a in algos if a != "tuner")
    fig, axes = plt.subplots(2, len(ns), figsize=(6 * len(ns), 9), squeeze=False)
    out = [f"# Allreduce algorithms, {label}: forced and the tuner's choice", ""]
    exceptions = []
    for col, n in enumerate(ns):
        sizes = sorted({k[2] for k in best if k[0] == n})
        winners = []
        out += [f"## N = {n}", "",
                "| size | " + " | ".join(forced)
                + " | best | tuner's pick | pick (forced) / best | tuner run / best |",
                "|---:|" + "---:|" * len(forced) + "---|---|---:|---:|"]
        for s in sizes:
            times = {a: best[(n, a, s)][0] for a in forced if (n, a, s) in best}
            if not times:
                continue
            win = min(times, key=times.get)
            winners.append((s, win))
            cells = [us(times[a]) if a in times else "-" for a in forced]
            tun = best.get((n, "tuner", s))
            ratio = tun[0] / times[win] if tun else float("nan")
            pick = tun[2] if tun else None
            choice = times[pick] / times[win] if pick in times else float("nan")
            if tun and (ratio > 1.10 or choice > 1.10):
                exceptions.append((n, s, pick, tun[0], win, times[win], ratio, choice))
            out.append(f"| {human(s)} | " + " | ".join(cells) + f" | {win} | "
                       + (f"{pick} | {choice:.2f} | {ratio:.2f} ({us(tun[0])}) |" if tun
                          else "- | - | - |"))
        out.append("")
        crossings = [(s, w) for i, (s, w) in enumerate(winners) if i == 0 or winners[i - 1][1] != w]
        out.append("Best forced by size: " + ", ".join(f"{w} from {human(s)}" for s, w in crossings))
        out.append("")
        for a in algos:
            pts = sorted((k[2], v) for k, v in best.items() if k[0] == n and k[1] == a)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            style = dict(lw=2.5, color="black") if a == "tuner" else dict(lw=1.2, marker=".")
            axes[0][col].plot(xs, [p[1][0] for p in pts], label=a, **style)
            axes[1][col].plot(xs, [p[1][1] for p in pts], label=a, **style)
        for s, w in crossings[1:]:
            for row in (0, 1):
                axes[row][col].axvline(s, color="grey", ls=":", lw=0.8)
            axes[0][col].annotate(w, (s, axes[0][col].get_ylim()[1]), rotation=90, fontsize=7,
                                  va="top", ha="right", color="grey")
        axes[0][col].set_title(f"N = {n} ({label})")
        for row, ylabel in ((0, "time (us)"), (1, "busbw (GB/s)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("bytes per rank")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][col].legend(fontsize=8)
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=9, color="dimgrey")
    fig.tight_layout(rect=(0, 0.025, 1, 1))
    fig.savefig(png, dpi=90)
    out.append("## More than 10% from the best forced algorithm")
    out.append("")
    out.append("choice: the pick's forced time / the best's; run: the tuner's own run / the best's.")
    out.append("")
    if not exceptions:
        out.append("None.")
    for n, s, pick, t, win, bt, r, c in exceptions:
        out.append(f"- N={n} {human(s)}: pick {pick}, best {win} {us(bt)} us; choice {c:.2f}x, "
                   f"run {us(t)} us = {r:.2f}x")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
