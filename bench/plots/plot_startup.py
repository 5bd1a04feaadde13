#!/usr/bin/env python3
"""Plot of the start-up benchmark (bench/drivers/startup.sh).

usage: bench/plots/plot_startup.py STARTUP_CSV OUT_PNG [--setting TEXT] [--caption TEXT]

Reads startup.sh's rows (lib,n,round,ready_s,first_allreduce_s,last_start_s,wall_s,
store_requests,requests_per_rank,check), keeps the rounds whose checks passed, and draws per
library the best round's launch-to-first-allreduce time against N and, beside it, the store
requests per rank (where the store counted them; else when the last process started). The
caption names the machine, date and version: by default this machine's, today and this
checkout's (bench/plots/plot_caption.py), after --setting (e.g. "over 8 emulated hosts"); --caption
replaces it with the measuring run's when the plot is redrawn from a CSV in docs/.
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_caption  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("--setting", default="")
    ap.add_argument("--caption", default=None)
    a = ap.parse_args()
    caption = a.caption or ", ".join(x for x in (a.setting, plot_caption.default_caption()) if x)
    with open(a.csv) as f:
        rows = [r for r in csv.DictReader(f) if r["check"] == "ok"]
    by = {}
    for r in rows:
        by.setdefault((r["lib"], int(r["n"])), []).append(r)
    fig, ax = plt.subplots(1, 2, figsize=(10, 4.3))
    # Store requests where the store counted them (ringrun's); else when the last process started.
    has_req = any(r["requests_per_rank"] for rs in by.values() for r in rs)
    for lib in sorted({k[0] for k in by}):
        ns = sorted(n for (l, n) in by if l == lib)
        best_rows = [min(by[(lib, n)], key=lambda r: float(r["first_allreduce_s"])) for n in ns]
        ax[0].plot(ns, [float(r["first_allreduce_s"]) for r in best_rows], "o-", label=lib)
        if has_req and lib.startswith("ringreduce"):
            ax[1].plot(ns, [float(r["requests_per_rank"]) for r in best_rows], "o-", label=lib)
        elif not has_req:
            ax[1].plot(ns, [float(r["last_start_s"]) for r in best_rows], "o-", label=lib)
    for x in ax:
        x.set_xscale("log", base=2)
        x.set_xlabel("ranks")
        x.legend()
        x.grid(True, alpha=0.3)
    ax[0].set_ylabel("launch to first allreduce done (s, best of rounds)")
    ax[1].set_ylabel("store requests per rank" if has_req else "last process started (s, same rounds)")
    fig.suptitle("start-up" + (": " + a.setting if a.setting else ""))
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=8, color="dimgrey")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(a.png, dpi=100)
    print("plot:", a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
