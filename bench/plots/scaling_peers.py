#!/usr/bin/env python3
"""Add the peers to the scaling experiment's data: Gloo and OpenMPI beside the ring and the star.

usage: bench/plots/scaling_peers.py SCALING_CSV OUTDIR...

Each OUTDIR is a bench/drivers/cluster_compare.sh run on HOSTS hosts at the size of bench/drivers/scaling.sh's
run (one size, -b SIZE -e SIZE), at the same rate, e.g. for 2..8 hosts at 1 Gbit/s and 64 MiB:

    for n in 2 3 4 5 6 7 8; do
      bench/drivers/cluster_compare.sh -o /tmp/scaling-peers/N$n -H $n -R 1gbit -r 3 -b 64M -e 64M \
        -l "ringreduce gloo mpi mpiring"
    done
    bench/plots/scaling_peers.py docs/scaling.csv /tmp/scaling-peers/N*

Appends one row per peer, round and size, "hosts,algo,size_bytes,time_us,link_GBps" (algo: gloo,
mpi, mpiring; link: that round's single-flow rate), to SCALING_CSV, replacing rows of the same
peers and host counts already there. bench/plots/plot_scaling.py then draws them beside the ring.
"""
import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_table import FILE_RE, parse_rows, parse_stream  # noqa: E402

# ringreduce too: cluster_compare.sh's ringreduce (the tuner's choice) in the same rounds as the
# peers, so that their ratios come from one run.
PEERS = ("gloo", "mpi", "mpiring", "ringreduce")
FIELDS = ["hosts", "algo", "size_bytes", "time_us", "link_GBps"]


def rows_of(outdir):
    raw = os.path.join(outdir, "raw")
    files = sorted(os.listdir(raw))
    stream = {}  # (n, round) -> GB/s
    for fn in files:
        m = FILE_RE.match(fn)
        if m and m.group("lib") == "tcp_stream":
            with open(os.path.join(raw, fn), errors="replace") as f:
                v = parse_stream(f.read())
            if v is not None:
                stream[(int(m.group("n")), int(m.group("round")))] = v
    out = []
    for fn in files:
        m = FILE_RE.match(fn)
        if not m or m.group("lib") not in PEERS:
            continue
        n, rnd = int(m.group("n")), int(m.group("round"))
        link = stream.get((n, rnd))
        if link is None:
            print(f"scaling_peers: {outdir}: no single-flow rate for N={n} round {rnd}; skipped",
                  file=sys.stderr)
            continue
        with open(os.path.join(raw, fn), errors="replace") as f:
            for size, (time_us, _busbw, wrong) in sorted(parse_rows(f.read()).items()):
                if wrong:
                    print(f"scaling_peers: {fn}: {wrong} wrong at {size} bytes; skipped",
                          file=sys.stderr)
                    continue
                out.append({"hosts": n, "algo": m.group("lib"), "size_bytes": size,
                            "time_us": f"{time_us:.2f}", "link_GBps": f"{link:.3f}"})
    return out


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, dirs = sys.argv[1], sys.argv[2:]
    new = [r for d in dirs for r in rows_of(d)]
    if not new:
        print("scaling_peers: no peer rows found", file=sys.stderr)
        return 1
    with open(path) as f:
        old = list(csv.DictReader(f))
    sizes = {int(r["size_bytes"]) for r in old if r["algo"] in ("ring", "star")}
    other = [r for r in new if r["size_bytes"] not in sizes]
    if sizes and other:
        print(f"scaling_peers: peers measured at {sorted({r['size_bytes'] for r in other})} bytes, "
              f"the ring at {sorted(sizes)}: run cluster_compare.sh with -b and -e at the ring's size",
              file=sys.stderr)
        return 1
    replaced = {(r["hosts"], r["algo"]) for r in new}
    kept = [r for r in old if (int(r["hosts"]), r["algo"]) not in replaced]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(kept + new)
    print(f"scaling_peers: {len(new)} peer rows for hosts "
          f"{sorted({r['hosts'] for r in new})} into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
