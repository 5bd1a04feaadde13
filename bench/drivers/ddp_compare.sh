#!/usr/bin/env bash
# DDP time per training step of examples/train_ddp.py (MLP on scikit-learn's digits), backend
# ringreduce vs gloo, in the same run: for each N, ROUNDS interleaved rounds (the order alternates)
# of `ringrun -n N python3 examples/train_ddp.py --backend B`; one process as the reference.
# Prints each run's final line and a markdown table of the median step time over the rounds
# (each run's own figure is the median of its steps after 5 warm-up steps).
#
# usage: bench/drivers/ddp_compare.sh [-N "2 4"] [-r ROUNDS] [-- extra train_ddp.py arguments]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build}
NS="2 4"
ROUNDS=3
while [ $# -gt 0 ]; do
  case $1 in
    -N) NS=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
run() {  # run N BACKEND
  local line
  if [ "$1" -eq 1 ]; then
    line=$(env -u WORLD_SIZE timeout 600 /usr/bin/python3 "$ROOT/examples/train_ddp.py" --quiet "${@:3}" | grep '^final:')
  else
    line=$("$BUILD/tools/ringrun" -n "$1" --timeout 600 /usr/bin/python3 "$ROOT/examples/train_ddp.py" \
      --backend "$2" --quiet "${@:3}" | grep 'final:')
  fi
  echo "N=$1 $2 $line" | tee -a "$results"
}
for round in $(seq 1 "$ROUNDS"); do
  run 1 none "$@"
  for n in $NS; do
    order="ringreduce gloo"
    [ $((round % 2)) -eq 0 ] && order="gloo ringreduce"
    for b in $order; do run "$n" "$b" "$@"; done
  done
done
/usr/bin/python3 - "$results" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"N=(\d+) (\S+) .*test_accuracy=([\d.]+) step_ms_median=([\d.]+)", line)
    if m:
        runs.setdefault((int(m[1]), m[2]), []).append((float(m[4]), float(m[3])))
print("\n| ranks | backend | step time, median of rounds (ms) | rounds (ms) | test accuracy |")
print("|---:|---|---:|---|---:|")
for (n, b), v in sorted(runs.items()):
    ms = [x for x, _ in v]
    print(f"| {n} | {b} | {statistics.median(ms):.3f} | {', '.join(f'{x:.3f}' for x in ms)} | "
          f"{v[-1][1]:.4f} |")
PY
