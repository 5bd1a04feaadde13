#!/usr/bin/env bash
# The tuner's evidence (issue 5): allreduce with every algorithm forced, and with the tuner's own
# choice, over 4 B .. 256 MiB at N = 2, 4, 8 ranks, on this machine (default: shared memory) or
# on an emulated cluster (--cluster HOSTS RATE, one rank per host, needs root). Writes, beside
# the plot, algorithms_<label>.png (time and busbw against size, one column per N, crossovers
# marked), .md (the table: best forced, the tuner's pick and its ratio to the best) and .csv.
#
#   ringreduce  build/tools/ringrun -n N build/tools/ringreduce-perf allreduce -b MIN -e MAX -f F
#               -w 2 --time-per-size 0.1 [--algorithm ALGO] -d float -o sum
#               (out-of-place time column)
#
# ROUNDS interleaved rounds (the algorithm order rotates each round); per size and algorithm the
# best round counts. Rows where a forced algorithm was not what ran (flat above its size limit)
# are dropped.
#
# usage: bench/drivers/algo_sweep.sh [-o OUTDIR] [-N "2 4 8"] [-r ROUNDS] [-b MIN] [-e MAX] [-f FACTOR]
#          [-l LABEL] [-p PNG_DIR] [-s shm|tcp] [--cluster RATE] [-B BUILD]
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=/tmp/rr_algo_sweep NS="2 4 8" ROUNDS=3 MIN=4 MAX=256M FACTOR=4 LABEL="" DOCS=$ROOT/docs
KIND=shm RATE="" BUILD=$ROOT/build
while [ $# -gt 0 ]; do
  case $1 in
    -o) OUT=$2; shift 2 ;; -N) NS=$2; shift 2 ;; -r) ROUNDS=$2; shift 2 ;;
    -b) MIN=$2; shift 2 ;; -e) MAX=$2; shift 2 ;; -f) FACTOR=$2; shift 2 ;;
    -l) LABEL=$2; shift 2 ;; -p) DOCS=$2; shift 2 ;; -s) KIND=$2; shift 2 ;;
    --cluster) RATE=$2; KIND=net; shift 2 ;; -B) BUILD=$2; shift 2 ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -n "$LABEL" ] || LABEL=$KIND${RATE:+_$RATE}
PERF=$BUILD/tools/ringreduce-perf RINGRUN=$BUILD/tools/ringrun
[ -x "$PERF" ] && [ -x "$RINGRUN" ] || { echo "algo_sweep: build first ($PERF)" >&2; exit 2; }
PY=/usr/bin/python3  # Debian's, with Debian's matplotlib (a pyenv python may lack it)
if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y python3-matplotlib >&2 ||
    { echo "algo_sweep: cannot install python3-matplotlib" >&2; exit 2; }
fi
ALGOS="tuner ring rabenseifner rd tree"
[ "$KIND" = shm ] && ALGOS="$ALGOS flat direct"
CLUSTER=$ROOT/scripts/cluster
if [ -n "$RATE" ]; then
  [ "$(id -u)" = 0 ] || { echo "algo_sweep: --cluster needs root" >&2; exit 2; }
  export CLUSTER_NAME=rras
  trap '"$CLUSTER" down' EXIT
fi
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$OUT/raw"
say() { echo "[algo_sweep $(date +%H:%M:%S)] $*" >&2; }
CSV=$OUT/algorithms_$LABEL.csv
echo "ranks,round,algo,size_bytes,time_us,busbw_GBps,ran" >"$CSV"
for n in $NS; do
  [ -n "$RATE" ] && { "$CLUSTER" up "$n" --rate "$RATE" >&2 || exit 1; }
  for round in $(seq 1 "$ROUNDS"); do
    # Rotate the order each round so that no algorithm always runs first (or last).
    read -ra list <<<"$ALGOS"
    off=$(((round - 1) % ${#list[@]}))
    for algo in "${list[@]:off}" "${list[@]:0:off}"; do
      raw=$OUT/raw/N${n}_r${round}_$algo.txt
      force=() env=()
      [ "$algo" = tuner ] || force=(--algorithm "$algo")
      [ "$KIND" = tcp ] && env=(env RINGREDUCE_SHM=0)
      cmd=("$PERF" allreduce -b "$MIN" -e "$MAX" -f "$FACTOR" -w 2 --time-per-size 0.1 -d float -o sum "${force[@]}")
      if [ -n "$RATE" ]; then
        "$CLUSTER" run --timeout 900 -- "${cmd[@]}" >"$raw" 2>&1
      else
        timeout 900 "${env[@]}" "$RINGRUN" -n "$n" "${cmd[@]}" >"$raw" 2>&1
      fi || { tail -5 "$raw" >&2; say "N=$n $algo failed"; exit 1; }
      # Row: [0] size count type redop root time algbw busbw #wrong time algbw busbw #wrong algo..
      awk -v n="$n" -v r="$round" -v a="$algo" '$1 == "[0]" && $2 ~ /^[0-9]+$/ {
          printf "%s,%s,%s,%s,%s,%s,%s\n", n, r, a, $2, $7, $9, $15 }' "$raw" >>"$CSV"
      say "N=$n round $round $algo done"
    done
  done
  [ -n "$RATE" ] && "$CLUSTER" down >&2
done
mkdir -p "$DOCS"
"$PY" "$ROOT/bench/plots/plot_algos.py" "$CSV" "$DOCS/algorithms_$LABEL.png" "$LABEL" >"$OUT/algorithms_$LABEL.md" ||
  exit 1
cp "$CSV" "$OUT/algorithms_$LABEL.md" "$DOCS/"
say "wrote $DOCS/algorithms_$LABEL.png, .md, .csv"
