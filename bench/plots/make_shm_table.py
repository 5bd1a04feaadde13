#!/usr/bin/env python3
"""Markdown table from the raw outputs of bench/drivers/compare.sh shm (standard library only).

usage: bench/plots/make_shm_table.py OUTDIR [--small BYTES] [--large BYTES]

Reads OUTDIR/raw/<lib>_N<n>_r<round>.txt for lib in ringreduce, ompi, mpich (nccl-tests style
rows, parsed by bench/plots/make_table.py) and stream (bench/stream_copy lines), and prints, for each
N, one row per size with:
  - every library's best-of-rounds busbw (GB/s), plus its best time for sizes <= --small (4 KiB);
    ringreduce: the in-place columns of ringreduce-perf; OpenMPI and MPICH: mpi_allreduce -i 1
    (a run whose header does not say "(in-place)" is flagged);
  - rr/best MPI: the better MPI's best time / ringreduce's best time (> 1: ringreduce faster),
    and which MPI that was;
  - for sizes >= --large (16 MiB): the memory-bandwidth floor and ringreduce's fraction of it:
        time_floor = 2 x size x N / stream_rw_bandwidth(all cores)
        fraction   = time_floor / ringreduce's best time
    (each rank reads its input once and writes its output once; stream_rw_bandwidth is
    stream_copy's best_GBps_rw with one thread per core, the best over every round, N and the
    kernels that move memory the fastest ways this machine has (nt, movsb, add, add_nt: not
    glibc's memcpy, whose cached stores add a read for ownership): the highest bandwidth gives
    the lowest floor, so the fraction is not flattered by a slow round or a slow kernel);
    and the fraction of the limit the project's issue 19 set its targets against: the best of a
    non-temporal copy and `a += b` (nt, add) on all cores, a lower bandwidth than the fastest
    kernel's (rep movsb here), so a higher fraction.
Where OUTDIR/raw has latency_N<n>_r<round>.txt (bench/latency_floor), each N also gets a table
of the sizes up to --tiny (64 B) against the latency floor of that N's rounds (their least):
    N <= cores: one exchange of a cache line between two cores (a lower bound for N > 2);
    N > cores:  N processes placed as the ranks are (r on core r mod cores), each op every one
                writing its line and seeing all others' (latency_floor -p N, "crowded"): each core
                runs its m ranks in turn, m - 1 process switches per op, and an op ends when the
                slower core's switches have; without that run, (m - 1) single switches, a lower
                floor that leaves out the cores' wait for each other;
and ringreduce's and the better MPI's time over it, and whether half the MPI's time (issue 19's
target for 4 B) is above the floor at all.
"""
import argparse
import os
import re
import sys
from collections import defaultdict

sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_table import FILE_RE, fmt_time, human, parse_rows  # noqa: E402

LIBS = [  # (key in file names, column title)
    ("ringreduce", "ringreduce"),
    ("registered", "rr registered"),
    ("ompi", "OpenMPI"),
    ("mpich", "MPICH"),
]
MPIS = ["ompi", "mpich"]
STREAM_RE = re.compile(
    r"^stream (?P<kernel>\w+) threads=(?P<threads>\d+) size=(?P<size>\d+) .*?"
    r"best_GBps_rw=(?P<rw>[0-9.]+) copy_GBps=(?P<copy>[0-9.]+)", re.M)
LATENCY_RE = re.compile(r"^floor (?P<mode>cross-core|same-core|crowded) .*?us_per_op=(?P<us>[0-9.]+)", re.M)
# The kernels whose bandwidth is the machine's limit (stream_copy.cc); glibc's "copy" only when a
# run has nothing else (outputs of an older stream_copy).
LIMIT_KERNELS = ("nt", "movsb", "add", "add_nt")
# The targets' limit: a non-temporal copy and `a += b`.
TARGET_KERNELS = ("nt", "add")


def parse_stream(text):
    """{(kernel, threads): best_GBps_rw} from stream_copy's output."""
    return {(m.group("kernel"), int(m.group("threads"))): float(m.group("rw"))
            for m in STREAM_RE.finditer(text)}


def fmt_us(us):
    """A time to the precision a sub-microsecond floor needs."""
    return f"{us:.3f} us" if us < 1 else (f"{us:.2f} us" if us < 10 else fmt_time(us))


def latency_floor(n, cores, lat):
    """(floor in us, how it was made) for N ranks from one N's latency_floor runs, or None."""
    m = -(-n // cores)  # ranks per core
    if m <= 1:
        v = lat.get("cross-core")
        return (min(v), "one cross-core exchange") if v else None
    switches = f"{m - 1} process switch{'es' if m > 2 else ''} per core and op ({m} ranks per core)"
    v = lat.get("crowded")
    if v:
        return min(v), f"{n} pinned processes exchanging lines, {switches}"
    v = lat.get("same-core")
    if not v:
        return None
    return (m - 1) * min(v), switches


def latency_table(n, cores, lat, rows, tiny):
    """Lines of the small-size table against the latency floor (nothing without its runs)."""
    floor = latency_floor(n, cores, lat)
    sizes = sorted(sz for sz in {s for k, _ in LIBS for s in rows.get(k, {})} if sz <= tiny)
    if not floor or not sizes:
        return []
    f_us, how = floor
    runs = ", ".join(f"{mode} {', '.join(f'{x:.3f}' for x in v)} us"
                     for mode, v in sorted(lat.items()))
    out = [f"Latency floor at N = {n}: {fmt_us(f_us)} ({how}; latency_floor runs: {runs}). "
           "x/floor = x's best time over the floor; target/floor = half the better MPI's best "
           "time over the floor (< 1: the 0.5x target lies below what the machine allows).",
           "",
           "| size | floor | rr | rr/floor | best MPI | MPI/floor | target/floor |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for sz in sizes:
        best = {k: min(t for t, _, _, _ in rows[k][sz]) for k, _ in LIBS if rows.get(k, {}).get(sz)}
        rr = best.get("ringreduce")
        mpi = min(((best[k], t) for k, t in LIBS if k in MPIS and k in best), default=None)
        cells = [human(sz), fmt_us(f_us),
                 fmt_us(rr) if rr else "-", f"{rr / f_us:.2f}" if rr else "-",
                 f"{fmt_us(mpi[0])} ({mpi[1]})" if mpi else "-",
                 f"{mpi[0] / f_us:.2f}" if mpi else "-",
                 f"{0.5 * mpi[0] / f_us:.2f}" if mpi else "-"]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--small", type=int, default=4096, help="also show time for sizes <= this")
    ap.add_argument("--tiny", type=int, default=64,
                    help="compare sizes <= this with the latency floor")
    ap.add_argument("--large", type=int, default=16 << 20,
                    help="show the memory-bandwidth fraction for sizes >= this")
    a = ap.parse_args()
    raw = os.path.join(a.outdir, "raw")
    if not os.path.isdir(raw):
        raw = a.outdir

    # data[n][lib][size] -> list of (time, busbw, wrong, round)
    data = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    stream = defaultdict(list)  # (kernel, threads) -> [best_GBps_rw of each run]
    latency = defaultdict(lambda: defaultdict(list))  # n -> mode -> [us_per_op of each run]
    runs = defaultdict(lambda: defaultdict(int))  # n -> lib -> files with rows
    not_in_place = []
    failed = []
    for fn in sorted(os.listdir(raw)):
        m = FILE_RE.match(fn)
        if not m:
            continue
        lib, n, rnd = m.group("lib"), int(m.group("n")), int(m.group("round"))
        with open(os.path.join(raw, fn), errors="replace") as f:
            text = f.read()
        if lib == "stream":
            v = parse_stream(text)
            if not v:
                failed.append(fn)
            for key, bw in v.items():
                stream[key].append(bw)
            continue
        if lib == "latency":
            found = LATENCY_RE.findall(text)
            if not found:
                failed.append(fn)
            for mode, us in found:
                latency[n][mode].append(float(us))
            continue
        rows = parse_rows(text, in_place=True)
        if not rows:
            failed.append(fn)
            continue
        if lib in MPIS and "(in-place)" not in text:
            not_in_place.append(fn)
        runs[n][lib] += 1
        for size, (time_us, busbw, wrong) in rows.items():
            data[n][lib][size].append((time_us, busbw, wrong, rnd))

    out = ["# Shared-memory allreduce on one host: ringreduce vs MPI\n"]
    setup = os.path.join(a.outdir, "setup.txt")
    if os.path.exists(setup):
        with open(setup) as f:
            out.append("```\n" + f.read().rstrip() + "\n```\n")
    out.append(
        "float32 sum allreduce, in place; cells are the best of the rounds' busbw in GB/s "
        "(busbw = size/time * 2(N-1)/N), with the best time for sizes <= "
        f"{human(a.small)}. rr/best MPI = the better MPI's time / ringreduce's time (> 1: "
        "ringreduce faster). From "
        f"{human(a.large)} up: mem floor = 2 x size x N / stream_rw (all cores), the time to "
        "read every rank's input once and write its output once; rr/floor = mem floor / "
        "ringreduce's time, i.e. the fraction of the memory-bandwidth limit ringreduce reaches. "
        "A `!` marks a size where some run reported wrong results.\n")

    cores = None
    if os.path.exists(setup):
        with open(setup) as f:
            m = re.search(r"(\d+) cpus", f.read())
            cores = int(m.group(1)) if m else None
    cores = cores or os.cpu_count() or 1

    all_threads = max(t for _, t in stream) if stream else None
    limit = [k for k in stream if k[1] == all_threads and k[0] in LIMIT_KERNELS] or \
        [k for k in stream if k[1] == all_threads]
    limit_key = max(limit, key=lambda k: max(stream[k])) if limit else None
    stream_bw = max(stream[limit_key]) if limit_key else None
    target = [max(stream[k]) for k in stream if k[1] == all_threads and k[0] in TARGET_KERNELS]
    target_bw = max(target) if target else None
    if stream:
        for kernel, threads in sorted(stream):
            s = stream[(kernel, threads)]
            out.append(f"stream {kernel}, {threads} thread{'s' if threads > 1 else ''}: best "
                       f"{max(s):.2f} GB/s read+write (runs: {', '.join(f'{v:.2f}' for v in s)})"
                       + ("  <- the limit used" if (kernel, threads) == limit_key else "") + "\n")
        if target_bw:
            out.append(f"targets' limit (best of nt and add, all cores): {target_bw:.2f} GB/s; "
                       "x/floor(nt,add) is the fraction against it\n")
    else:
        out.append("no stream_copy results: no memory-bandwidth column\n")

    for n in sorted(data):
        out.append(f"\n## N = {n}\n")
        counts = ", ".join(f"{t} {runs[n].get(k, 0)}" for k, t in LIBS)
        out.append(f"runs with results: {counts}\n")
        sizes = sorted({sz for k, _ in LIBS for sz in data[n].get(k, {})})
        # Ratios for ringreduce on ordinary buffers and, where measured, on registered ones
        # (--buffers registered: Communicator::alloc).
        ours = [k for k in ("ringreduce", "registered") if data[n].get(k)]
        tag = {"ringreduce": "rr", "registered": "reg"}
        head = (["size"] + [t for _, t in LIBS] + [f"{tag[k]}/best MPI" for k in ours] +
                ["mem floor"] + [f"{tag[k]}/floor" for k in ours] +
                [f"{tag[k]}/floor(nt,add)" for k in ours])
        out.append("")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join(["---:"] * len(head)) + "|")
        for sz in sizes:
            cells = [human(sz)]
            best_t = {}
            for k, _ in LIBS:
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
            # busbw ratio, from the times (the printed busbw is rounded to 0 for tiny sizes)
            mpi = [(best_t[k], title) for k, title in LIBS if k in MPIS and k in best_t]
            for k in ours:
                trr = best_t.get(k)
                if trr and mpi:
                    tm, title = min(mpi)
                    cells.append(f"{tm / trr:.2f} ({title})")
                else:
                    cells.append("-")
            if sz >= a.large and stream_bw:
                floor_us = 2.0 * sz * n / (stream_bw * 1e9) * 1e6
                cells.append(fmt_time(floor_us))
                for k in ours:
                    trr = best_t.get(k)
                    cells.append(f"{floor_us / trr:.2f}" if trr else "-")
                for k in ours:
                    trr = best_t.get(k)
                    target_us = 2.0 * sz * n / (target_bw * 1e9) * 1e6 if target_bw else None
                    cells.append(f"{target_us / trr:.2f}" if trr and target_us else "-")
            else:
                cells += ["-"] * (1 + 2 * len(ours))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        out += latency_table(n, cores, latency[n], data[n], a.tiny)
    if not data:
        out.append("\n(no allreduce results)\n")

    bad_runs = []
    log = os.path.join(a.outdir, "runs.log")
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            for line in f:
                m = re.match(r"^(\S+)\s+rc=(\d+)", line)
                if m and m.group(2) != "0":
                    why = ", timed out" if m.group(2) in ("124", "137") else ""
                    bad_runs.append(f"{m.group(1)} (rc={m.group(2)}{why})")
        with open(log, errors="replace") as f:
            skipped = sorted({line.split("] skip ", 1)[1].strip() for line in f if "] skip " in line})
        if skipped:
            out.append("\nskipped: " + "; ".join(skipped) + "\n")
    if bad_runs:
        out.append("\nruns that failed (their finished sizes are still used): "
                   + ", ".join(bad_runs) + "\n")
    if not_in_place:
        out.append("\nWARNING: measured out of place (no \"(in-place)\" header): "
                   + ", ".join(not_in_place) + "\n")
    if failed:
        out.append("\nfiles without results (failed, timed out or skipped): "
                   + ", ".join(failed) + "\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
