#!/usr/bin/env bash
# shellcheck disable=SC2086  # word splitting of lists is intended
# Float32 allreduce with narrow wire formats (CallOptions::wire, docs/WIRE.md) against the plain
# float32 allreduce, in the same run: on an emulated cluster (scripts/cluster: a network
# namespace per host, one rank each, links shaped with tbf at RATE), and with -S on shared
# memory (N ranks on this host) instead.
#   ROUNDS interleaved rounds run every format once each (the order rotates per round); a row's
#   time is ringreduce-perf's (the slowest rank's, out of place). Raw outputs go to
#   OUTDIR/raw/<wire>_r<round>.txt; the summary (best, median and worst of the rounds per format
#   and size, and each format's ratio to none's best) to OUTDIR/summary.txt.
#
# usage: bench/drivers/wire_compare.sh [-o OUTDIR] [-H HOSTS] [-R RATE] [-r ROUNDS] [-b MIN] [-e MAX]
#                              [-f FACTOR] [-w "none bf16 fp8e4m3 auto"] [-S] [-B BUILD_DIR]
# Needs root for the cluster (not with -S).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=/tmp/wire_compare-$(date +%Y%m%d-%H%M%S)
HOSTS=4 RATE=1gbit ROUNDS=3 MIN=64M MAX=64M FACTOR=4 WIRES="none bf16 fp8e4m3 auto" SHM=0
BUILD=build
usage() { sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -o) OUT=$2; shift 2 ;; -H) HOSTS=$2; shift 2 ;; -R) RATE=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;; -b) MIN=$2; shift 2 ;; -e) MAX=$2; shift 2 ;;
    -f) FACTOR=$2; shift 2 ;; -w) WIRES=$2; shift 2 ;; -S) SHM=1; shift ;;
    -B) BUILD=$2; shift 2 ;; -h | --help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done
RAW=$OUT/raw
mkdir -p "$RAW"
say() { echo "[wire_compare $(date +%H:%M:%S)] $*" >&2; }
CLUSTER=$ROOT/scripts/cluster
export CLUSTER_NAME=rrwc
if [ "$SHM" = 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "wire_compare: needs root (network namespaces), or -S" >&2; exit 2; }
  trap '"$CLUSTER" down' EXIT
  "$CLUSTER" up "$HOSTS" --rate "$RATE" >&2 || exit 1
  where="cluster: $HOSTS hosts, $RATE each way (tbf), one rank per host"
else
  where="shared memory: $HOSTS ranks on this host"
fi
trap 'exit 130' INT
{
  echo "date: $(date -Is)"
  echo "host: $(uname -srm), $(nproc) cpus; $where"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "sizes: -b $MIN -e $MAX -f $FACTOR; rounds: $ROUNDS; wires: $WIRES"
} | tee "$OUT/setup.txt" >&2

read -r -a wires <<<"$WIRES"
for r in $(seq 1 "$ROUNDS"); do
  k=${#wires[@]}
  for j in $(seq 0 $((k - 1))); do
    w=${wires[$(((j + r) % k))]}
    name=${w}_r$r
    say "round $r: $w"
    perf=("$BUILD/tools/ringreduce-perf" allreduce -b "$MIN" -e "$MAX" -f "$FACTOR" -d float -o sum
      --wire "$w")
    if [ "$SHM" = 0 ]; then
      timeout -k 10 900 "$CLUSTER" run --timeout 900 -- "${perf[@]}" >"$RAW/$name.txt" 2>&1
    else
      timeout -k 10 900 "$BUILD/tools/ringrun" -n "$HOSTS" "${perf[@]}" >"$RAW/$name.txt" 2>&1
    fi
    rc=$?
    sed -i -n 's/^\[0\] //p' "$RAW/$name.txt"
    [ "$rc" = 0 ] || say "$name failed (rc $rc): $(tail -n 3 "$RAW/$name.txt")"
  done
done

# Summary: per wire and size, the out-of-place times (us) of every round.
python3 - "$RAW" "$ROUNDS" $WIRES >"$OUT/summary.txt" <<'PY'
import os, statistics, sys
raw, rounds, wires = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
times = {}  # (wire, bytes) -> [us]
for w in wires:
    for r in range(1, rounds + 1):
        path = os.path.join(raw, f"{w}_r{r}.txt")
        if not os.path.exists(path):
            continue
        for line in open(path):
            f = line.split()
            if len(f) > 6 and f[0].isdigit() and f[2] == "float":
                times.setdefault((w, int(f[0])), []).append(float(f[5]))
sizes = sorted({b for _, b in times})
print(f"{'bytes':>10} {'wire':>8} {'best us':>11} {'median':>11} {'worst':>11} {'spread':>7} {'x none':>7}")
for b in sizes:
    base = min(times.get(("none", b), [float("nan")]))
    for w in wires:
        t = times.get((w, b))
        if not t:
            continue
        print(f"{b:>10} {w:>8} {min(t):>11.0f} {statistics.median(t):>11.0f} {max(t):>11.0f} "
              f"{(max(t) - min(t)) / min(t):>6.1%} {min(t) / base:>7.3f}")
PY
cat "$OUT/summary.txt"
