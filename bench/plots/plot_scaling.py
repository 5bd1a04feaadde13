#!/usr/bin/env python3
"""Plot and table of the scaling experiment (bench/drivers/scaling.sh).

usage: bench/plots/plot_scaling.py SCALING_CSV OUT_PNG RATE_LABEL [--caption TEXT]

Reads rows "hosts,algo,size_bytes,time_us,link_GBps" (several per run: out of place, in place,
rounds; the best is used), draws allreduce time against the number of hosts for the ring, the
star, the ring bound 2(N-1)/N * K / B and the star bound (N-1) * K / B (B: the single-flow rate
measured on that cluster), and every other algo in the CSV as a peer measured on the same
clusters (gloo: Gloo's ring_chunked, mpi: OpenMPI's default, mpiring: OpenMPI's ring; rows added
by bench/plots/scaling_peers.py from bench/drivers/cluster_compare.sh runs), writes OUT_PNG, and prints the
markdown table. The plot's caption names the machine, date and version: by default this
machine's, today and this checkout's (bench/plots/plot_caption.py); --caption gives the measuring
run's when the plot is redrawn from old data.
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

# Peers' labels and styles, in the order they are drawn.
PEERS = {
    "gloo": ("Gloo ring_chunked (measured)", "tab:green", "^-"),
    "mpi": ("OpenMPI default (measured)", "tab:purple", "v-"),
    "mpiring": ("OpenMPI ring (measured)", "tab:orange", "D-"),
    # ringreduce again, the tuner's choice, in the same runs as the peers (the ring and star
    # series come from bench/drivers/scaling.sh's own runs).
    "ringreduce": ("ringreduce, tuner's choice (measured beside the peers)", "tab:blue", "s--"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("rate")
    ap.add_argument("--caption", default=None)
    a = ap.parse_args()
    caption = a.caption or plot_caption.default_caption()
    best = defaultdict(lambda: float("inf"))  # (hosts, algo) -> seconds
    link, size = {}, None
    with open(a.csv) as f:
        for row in csv.DictReader(f):
            n = int(row["hosts"])
            size = int(row["size_bytes"])
            best[(n, row["algo"])] = min(best[(n, row["algo"])], float(row["time_us"]) / 1e6)
            # The bounds use the rate scaling.sh measured beside the ring and star.
            if row["algo"] in ("ring", "star") or n not in link:
                link[n] = float(row["link_GBps"]) * 1e9
    hosts = sorted(link)
    ring_bound = {n: 2 * (n - 1) / n * size / link[n] for n in hosts}
    star_bound = {n: (n - 1) * size / link[n] for n in hosts}
    peers = [p for p in PEERS if any((n, p) in best for n in hosts)]
    peers += sorted({k[1] for k in best} - set(PEERS) - {"ring", "star"})

    mib = size / 2**20
    print(f"Allreduce of {mib:g} MiB (float32 sum), one rank per host, links at {a.rate}; time in "
          "seconds (best of out of place, in place and rounds). B is the single-flow rate "
          "measured on each cluster; bounds use it.\n")
    head = ("| hosts | B (GB/s) | ring | ring bound 2(N-1)/N·K/B | ring / bound | star | "
            "star bound (N-1)·K/B | star / ring |")
    rule = "|---:|---:|---:|---:|---:|---:|---:|---:|"
    for p in peers:
        head += f" {p} | {p} / ring |"
        rule += "---:|---:|"
    print(head)
    print(rule)

    def cell(v):
        return f"{v:.3f}" if v != float("inf") else "-"

    for n in hosts:
        ring, star = best[(n, "ring")], best[(n, "star")]
        line = (f"| {n} | {link[n] / 1e9:.3f} | {cell(ring)} | {ring_bound[n]:.3f} | "
                f"{ring_bound[n] / ring:.1%} | {cell(star)} | {star_bound[n]:.3f} | "
                f"{star / ring:.2f}x |")
        for p in peers:
            t = best[(n, p)]
            line += f" {cell(t)} | " + (f"{t / ring:.2f}x |" if t != float("inf") else "- |")
        print(line)

    def series(algo):
        pts = [(n, best[(n, algo)]) for n in hosts if best[(n, algo)] != float("inf")]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    ax.plot(*series("star"), "s-", color="tab:red", label="star allreduce (measured)")
    ax.plot(hosts, [star_bound[n] for n in hosts], ":", color="tab:red",
            label="star bound (N-1)·K/B")
    for p in peers:
        label, color, style = PEERS.get(p, (f"{p} (measured)", None, "x-"))
        ax.plot(*series(p), style, color=color, label=label)
    ax.plot(*series("ring"), "o-", color="tab:blue", label="ringreduce ring (measured)")
    ax.plot(hosts, [ring_bound[n] for n in hosts], "--", color="tab:blue",
            label="ring bound 2(N-1)/N·K/B")
    ax.set_xlabel("hosts N (one rank each)")
    ax.set_ylabel("allreduce time (s)")
    ax.set_title(f"Allreduce of {mib:g} MiB on an emulated cluster, {a.rate} links")
    ax.set_xticks(hosts)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if not peers:
        ax.text(0.99, 0.02, "peers (Gloo, OpenMPI) not measured in this run", ha="right",
                va="bottom", fontsize=7, color="grey", transform=ax.transAxes)
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=7, color="dimgrey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
