#!/usr/bin/env python3
"""Plot and table of the scaling experiment (bench/scaling.sh).

usage: bench/plot_scaling.py SCALING_CSV OUT_PNG RATE_LABEL

Reads rows "hosts,algo,size_bytes,time_us,link_GBps" (two per run: out of place, in place; the
better is used), draws allreduce time against the number of hosts for the ring, the star, the
ring bound 2(N-1)/N * K / B and the star bound (N-1) * K / B (B: the single-flow rate measured on
that cluster), writes OUT_PNG, and prints the markdown table.
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    path, png, rate = sys.argv[1:]
    best = defaultdict(lambda: float("inf"))  # (hosts, algo) -> seconds
    link, size = {}, None
    with open(path) as f:
        for row in csv.DictReader(f):
            n = int(row["hosts"])
            size = int(row["size_bytes"])
            best[(n, row["algo"])] = min(best[(n, row["algo"])], float(row["time_us"]) / 1e6)
            link[n] = float(row["link_GBps"]) * 1e9
    hosts = sorted(link)
    ring_bound = {n: 2 * (n - 1) / n * size / link[n] for n in hosts}
    star_bound = {n: (n - 1) * size / link[n] for n in hosts}

    mib = size / 2**20
    print(f"Allreduce of {mib:g} MiB (float32 sum), one rank per host, links at {rate}; time in "
          "seconds (better of out of place and in place). B is the single-flow rate measured on "
          "each cluster; bounds use it.\n")
    print("| hosts | B (GB/s) | ring | ring bound 2(N-1)/N·K/B | ring / bound | star | "
          "star bound (N-1)·K/B | star / ring |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in hosts:
        ring, star = best[(n, "ring")], best[(n, "star")]
        print(f"| {n} | {link[n] / 1e9:.3f} | {ring:.3f} | {ring_bound[n]:.3f} | "
              f"{ring_bound[n] / ring:.1%} | {star:.3f} | {star_bound[n]:.3f} | {star / ring:.2f}x |")

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(hosts, [best[(n, "star")] for n in hosts], "s-", color="tab:red",
            label="star allreduce (measured)")
    ax.plot(hosts, [star_bound[n] for n in hosts], ":", color="tab:red",
            label="star bound (N-1)·K/B")
    ax.plot(hosts, [best[(n, "ring")] for n in hosts], "o-", color="tab:blue",
            label="ringreduce ring (measured)")
    ax.plot(hosts, [ring_bound[n] for n in hosts], "--", color="tab:blue",
            label="ring bound 2(N-1)/N·K/B")
    ax.set_xlabel("hosts N (one rank each)")
    ax.set_ylabel("allreduce time (s)")
    ax.set_title(f"Allreduce of {mib:g} MiB on an emulated cluster, {rate} links")
    ax.set_xticks(hosts)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
