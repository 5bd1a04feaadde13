#!/usr/bin/env bash
# torch.distributed.all_reduce, backend ringreduce vs gloo, in the same run on this host:
# for each N, ROUNDS interleaved rounds run bench/torch_allreduce.py once per backend (the order
# alternates per round) under ringrun -n N (rank r pinned to core r mod ncores, one torch thread
# per rank). Prints a markdown table of the best time per size over the rounds for each backend
# and the ratio gloo/ringreduce; raw outputs go to OUTDIR.
#
# usage: bench/torch_compare.sh [-o OUTDIR] [-N "2 4"] [-r ROUNDS] [-b MIN] [-e MAX] [-f FACTOR]
#   Defaults: -N "2 4" -r 3 -b 4 -e 256M -f 4. Every run is bounded by ringrun --timeout.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
OUT=/tmp/torch_compare-$(date +%Y%m%d-%H%M%S)
NS="2 4"
ROUNDS=3
MIN=4
MAX=256M
FACTOR=4
while [ $# -gt 0 ]; do
  case $1 in
    -o) OUT=$2; shift 2 ;;
    -N) NS=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;;
    -b) MIN=$2; shift 2 ;;
    -e) MAX=$2; shift 2 ;;
    -f) FACTOR=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}
for n in $NS; do
  for round in $(seq 1 "$ROUNDS"); do
    order="ringreduce gloo"
    [ $((round % 2)) -eq 0 ] && order="gloo ringreduce"
    for b in $order; do
      echo "== N=$n round $round $b" >&2
      "$BUILD/tools/ringrun" -n "$n" --timeout 900 /usr/bin/python3 \
        "$ROOT/bench/torch_allreduce.py" --backend "$b" -b "$MIN" -e "$MAX" -f "$FACTOR" \
        > "$OUT/n${n}_r${round}_$b.txt" 2>&1 || { echo "run failed: $OUT/n${n}_r${round}_$b.txt" >&2; exit 1; }
    done
  done
done
/usr/bin/python3 - "$OUT" $NS <<'PY'
import glob, os, sys
out, ns = sys.argv[1], sys.argv[2:]
for n in ns:
    best = {}
    for b in ("ringreduce", "gloo"):
        for f in glob.glob(os.path.join(out, f"n{n}_r*_{b}.txt")):
            for line in open(f):
                parts = line.split()
                if len(parts) == 9 and parts[0] == "[0]" and parts[1].isdigit():
                    size, t, busbw = int(parts[1]), float(parts[5]), float(parts[7])
                    k = (b, size)
                    if k not in best or t < best[k][0]:
                        best[k] = (t, busbw)
    sizes = sorted({s for (_, s) in best})
    print(f"\nN={n} (best of the rounds; time in us, busbw in GB/s)\n")
    print("| size | ringreduce time | gloo time | ringreduce busbw | gloo busbw | gloo/ringreduce |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        r, g = best.get(("ringreduce", s)), best.get(("gloo", s))
        if r and g:
            print(f"| {s} | {r[0]:.1f} | {g[0]:.1f} | {r[1]:.3f} | {g[1]:.3f} | {g[0] / r[0]:.2f}x |")
PY
