#!/usr/bin/env python3
"""Markdown table from the raw outputs of bench/drivers/compare.sh tcp (standard library only).

usage: bench/plots/make_table.py OUTDIR [--small BYTES]

Reads OUTDIR/raw/<lib>_N<n>_r<round>.txt (nccl-tests style rows) and
OUTDIR/raw/tcp_stream_N<n>_r<round>.txt, and prints, for each N, one row per size with every
library's best-of-rounds busbw (GB/s) - plus its best time for sizes <= 4 KiB - and the ratios
ringreduce/Gloo and ringreduce/OpenMPI (busbw ratio, i.e. > 1 means ringreduce is faster).

Rows understood (everything after a '#' is ignored; '#'-lines are comments):
  size count type redop time algbw busbw #wrong                       (bench/peers programs)
  size count type redop root time algbw busbw #wrong [time algbw busbw #wrong]   (nccl-tests,
                                       ringreduce-perf: the first, out-of-place, group is used)
"""
import argparse
import os
import re
import sys
from collections import defaultdict

LIBS = [  # (key in file names, column title)
    ("ringreduce", "ringreduce"),
    ("gloo", "Gloo ring_chunked"),
    ("torch", "torch+gloo"),
    ("mpi", "OpenMPI tcp"),
    ("mpiring", "OpenMPI ring"),
]
RATIOS = [("gloo", "rr/Gloo"), ("mpi", "rr/OpenMPI")]  # ringreduce busbw / peer busbw
FILE_RE = re.compile(r"^(?P<lib>[A-Za-z0-9_]+?)_N(?P<n>\d+)_r(?P<round>\d+)\.txt$")


def is_int(s):
    try:
        int(s)
        return True
    except ValueError:
        return False


def is_float(s):
    try:
        float(s)
        return True
    except ValueError:
        return False


def parse_rows(text, in_place=False):
    """{size: (time_us, busbw, wrong)} from nccl-tests style output: the out-of-place group, or
    with in_place=True the second (in-place) group of rows that have two. Rows with a single
    group are returned as they are either way: which variant that is, the program's header says
    (bench/drivers/compare.sh shm's bench/plots/make_shm_table.py checks it)."""
    rows = {}
    for line in text.splitlines():
        line = re.sub(r"^\[\d+\]\s", "", line)  # ringrun's "[rank] " prefix
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        t = line.split()
        if len(t) < 8 or not (is_int(t[0]) and is_int(t[1])) or is_float(t[2]):
            continue
        if len(t) in (9, 13):
            off = 5  # root column present
        elif len(t) in (8, 12):
            off = 4
        else:
            off = 5 if is_int(t[4]) and len(t) >= 9 else 4
        if in_place and len(t) >= off + 8 and all(is_float(x) for x in t[off + 4:off + 7]):
            off += 4  # the in-place group follows the out-of-place one
        try:
            time_us, busbw = float(t[off]), float(t[off + 2])
        except (ValueError, IndexError):
            continue
        wrong = t[off + 3] if off + 3 < len(t) else "N/A"
        rows[int(t[0])] = (time_us, busbw, int(wrong) if is_int(wrong) else None)
    return rows


def parse_stream(text):
    m = re.search(r"GB/s=([0-9.]+)", text)
    return float(m.group(1)) if m else None


def human(nbytes):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def fmt_time(us):
    return f"{us:.0f} us" if us >= 100 else f"{us:.1f} us"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--small", type=int, default=4096, help="also show time for sizes <= this")
    a = ap.parse_args()
    raw = os.path.join(a.outdir, "raw")
    if not os.path.isdir(raw):
        raw = a.outdir

    # data[n][lib][size] -> list of (time, busbw, wrong, round)
    data = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    stream = defaultdict(list)  # n -> [GB/s]
    runs = defaultdict(lambda: defaultdict(int))  # n -> lib -> files with rows
    failed = []
    for fn in sorted(os.listdir(raw)):
        m = FILE_RE.match(fn)
        if not m:
            continue
        lib, n, rnd = m.group("lib"), int(m.group("n")), int(m.group("round"))
        with open(os.path.join(raw, fn), errors="replace") as f:
            text = f.read()
        if lib == "tcp_stream":
            v = parse_stream(text)
            if v is not None:
                stream[n].append(v)
            else:
                failed.append(fn)
            continue
        rows = parse_rows(text)
        if not rows:
            failed.append(fn)
            continue
        runs[n][lib] += 1
        for size, (time_us, busbw, wrong) in rows.items():
            data[n][lib][size].append((time_us, busbw, wrong, rnd))

    out = []
    setup = os.path.join(a.outdir, "setup.txt")
    out.append("# Allreduce over TCP: ringreduce vs peers\n")
    if os.path.exists(setup):
        with open(setup) as f:
            out.append("```\n" + f.read().rstrip() + "\n```\n")
    out.append("float32 sum allreduce; cells are the best of the rounds' busbw in GB/s "
               "(busbw = size/time * 2(N-1)/N), with the best time for sizes <= "
               f"{a.small} B. Ratios are ringreduce busbw / peer busbw (> 1: ringreduce "
               "faster). ringreduce: out-of-place columns of ringreduce-perf. A `!` marks a size "
               "where some run reported wrong results.\n")

    libs_present = [(k, t) for k, t in LIBS]
    for n in sorted(set(data) | set(stream)):
        out.append(f"\n## N = {n}\n")
        counts = ", ".join(f"{t} {runs[n].get(k, 0)}" for k, t in LIBS)
        out.append(f"runs with results: {counts}\n")
        if stream[n]:
            s = stream[n]
            out.append(f"single-stream TCP (tcp_stream, 4 MiB writes): best {max(s):.2f} GB/s "
                       f"(runs: {', '.join(f'{v:.2f}' for v in s)})\n")
        sizes = sorted({sz for k, _ in LIBS for sz in data[n].get(k, {})})
        if not sizes:
            out.append("\n(no allreduce results)\n")
            continue
        head = ["size"] + [t for _, t in libs_present] + [t for _, t in RATIOS]
        out.append("")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join(["---:"] * len(head)) + "|")
        for sz in sizes:
            cells = [human(sz)]
            best_t = {}
            for k, _ in libs_present:
                v = data[n].get(k, {}).get(sz)
                if not v:
                    cells.append("-")
                    continue
                t, b, _, _ = min(v, key=lambda x: (x[0], -x[1]))  # best time = best busbw
                best_t[k] = t
                bad = any(w is not None and w > 0 for _, _, w, _ in v)
                cell = f"{b:.3f}"
                if sz <= a.small:
                    cell += f" ({fmt_time(t)})"
                cells.append(cell + (" !" if bad else ""))
            for k, _ in RATIOS:
                # busbw ratio, from the times (the printed busbw is rounded to 0 for tiny sizes)
                trr, tp = best_t.get("ringreduce"), best_t.get(k)
                cells.append(f"{tp / trr:.2f}" if trr and tp else "-")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")

    bad_runs = []
    log = os.path.join(a.outdir, "runs.log")
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            for line in f:
                m = re.match(r"^(\S+)\s+rc=(\d+)", line)
                if m and m.group(2) != "0":
                    why = ", timed out" if m.group(2) in ("124", "137") else ""
                    bad_runs.append(f"{m.group(1)} (rc={m.group(2)}{why})")
    if bad_runs:
        out.append("\nruns that failed (their finished sizes are still used): " + ", ".join(bad_runs) + "\n")
    if failed:
        out.append("\nfiles without results (failed, timed out or skipped): " + ", ".join(failed) + "\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
