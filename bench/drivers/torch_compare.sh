#!/usr/bin/env bash
# torch.distributed.all_reduce (-t allreduce) or send/recv ping-pong (-t p2p), backend ringreduce
# vs gloo, in the same run on this host: for each N, ROUNDS interleaved rounds run
# bench/drivers/torch_allreduce.py or bench/drivers/torch_p2p.py once per backend (the order alternates per round)
# under ringrun -n N (rank r pinned to core r mod ncores, one torch thread per rank). Prints a
# markdown table of the best time per size over the rounds for each backend, each backend's
# spread over the rounds (slowest/best - 1) and the ratio gloo/ringreduce; raw outputs go to
# OUTDIR. PYTHON picks the interpreter (default /usr/bin/python3; another torch: see scripts/torch2).
#
# usage: bench/drivers/torch_compare.sh [-t allreduce|p2p] [-o OUTDIR] [-N "2 4"] [-r ROUNDS] [-b MIN]
#                               [-e MAX] [-f FACTOR]
#   Defaults: -t allreduce -N "2 4" -r 3 -b 4 -e 256M (p2p: 64M) -f 4. Every run is bounded by
#   ringrun --timeout.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build}
OUT=/tmp/torch_compare-$(date +%Y%m%d-%H%M%S)
NS="2 4"
ROUNDS=3
MIN=4
MAX=""
FACTOR=4
TEST=allreduce
PY=${PYTHON:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case $1 in
    -t) TEST=$2; shift 2 ;;
    -o) OUT=$2; shift 2 ;;
    -N) NS=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;;
    -b) MIN=$2; shift 2 ;;
    -e) MAX=$2; shift 2 ;;
    -f) FACTOR=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
case $TEST in
  allreduce) SCRIPT=torch_allreduce.py; MAX=${MAX:-256M} ;;
  p2p) SCRIPT=torch_p2p.py; MAX=${MAX:-64M} ;;
  *) echo "unknown test $TEST (allreduce or p2p)" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}
for n in $NS; do
  for round in $(seq 1 "$ROUNDS"); do
    order="ringreduce gloo"
    [ $((round % 2)) -eq 0 ] && order="gloo ringreduce"
    for b in $order; do
      echo "== N=$n round $round $b" >&2
      "$BUILD/tools/ringrun" -n "$n" --timeout 900 "$PY" \
        "$ROOT/bench/drivers/$SCRIPT" --backend "$b" -b "$MIN" -e "$MAX" -f "$FACTOR" \
        > "$OUT/n${n}_r${round}_$b.txt" 2>&1 || { echo "run failed: $OUT/n${n}_r${round}_$b.txt" >&2; exit 1; }
    done
  done
done
# shellcheck disable=SC2086  # NS: one argument per N
"$PY" - "$TEST" "$OUT" $NS <<'PY'
import glob, os, sys
test, out, ns = sys.argv[1], sys.argv[2], sys.argv[3:]
what = "busbw" if test == "allreduce" else "bw"
for n in ns:
    times = {}  # (backend, size) -> [time per round]
    bw = {}
    for b in ("ringreduce", "gloo"):
        for f in sorted(glob.glob(os.path.join(out, f"n{n}_r*_{b}.txt"))):
            for line in open(f):
                parts = line.split()
                # all_reduce rows: [0] size count type redop time algbw busbw #wrong;
                # ping-pong rows: [0] size time bw #wrong
                if len(parts) in (9, 5) and parts[0] == "[0]" and parts[1].isdigit():
                    size = int(parts[1])
                    t, b_ = (float(parts[5]), float(parts[7])) if len(parts) == 9 else \
                        (float(parts[2]), float(parts[3]))
                    times.setdefault((b, size), []).append(t)
                    if t == min(times[(b, size)]):
                        bw[(b, size)] = b_
    sizes = sorted({s for (_, s) in times})
    print(f"\nN={n} (best of the rounds; time in us, {what} in GB/s; spread: each backend's "
          f"slowest round / its best - 1)\n")
    print(f"| size | ringreduce time | gloo time | ringreduce {what} | gloo {what} | "
          f"ringreduce spread | gloo spread | gloo/ringreduce |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        r, g = times.get(("ringreduce", s)), times.get(("gloo", s))
        if r and g:
            print(f"| {s} | {min(r):.1f} | {min(g):.1f} | {bw[('ringreduce', s)]:.3f} | "
                  f"{bw[('gloo', s)]:.3f} | {(max(r) / min(r) - 1) * 100:.0f}% | "
                  f"{(max(g) / min(g) - 1) * 100:.0f}% | {min(g) / min(r):.2f}x |")
PY
