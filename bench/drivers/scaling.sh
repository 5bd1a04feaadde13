#!/usr/bin/env bash
# docs/scaling.md's experiment on an emulated cluster (scripts/cluster): allreduce time of
# SIZE (default 64 MiB, float32 sum) for N = 2..8 hosts, one rank each, links shaped to RATE
# (default 1gbit), for
#   ring   ringreduce's pipelined ring (RINGREDUCE_ALGO=allreduce:ring)
#   star   everyone sends to rank 0, which reduces and sends back (allreduce:star)
#   bound  the ring bound 2(N-1)/N * K / B, B = the single-flow rate measured on the same cluster
# and the star's own bound (N-1) * K / B (rank 0's link carries N-1 buffers each way).
# Writes OUTDIR/scaling.csv and OUTDIR/scaling.md, the plot docs/scaling.png (or -p PNG), and
# copies the table and the data beside the plot (docs/scaling.md, docs/scaling.csv); plotting with
# bench/plots/plot_scaling.py (python3-matplotlib). Each point is the mean over ITERS iterations (out of place
# and in place are both kept; the plot uses the better of the two).
#
# usage: bench/drivers/scaling.sh [-o OUTDIR] [-N "2 3 4 5 6 7 8"] [-R RATE] [-s SIZE] [-n ITERS]
#                         [-p PNG] [-B BUILD_DIR]
# Needs root; every cluster it brings up is taken down on exit.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=/tmp/scaling-$(date +%Y%m%d-%H%M%S) NS="2 3 4 5 6 7 8" RATE=1gbit SIZE=64M ITERS=3
PNG=$ROOT/docs/scaling.png BUILD=build
while [ $# -gt 0 ]; do
  case "$1" in
    -o) OUT=$2; shift 2 ;; -N) NS=$2; shift 2 ;; -R) RATE=$2; shift 2 ;; -s) SIZE=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;; -p) PNG=$2; shift 2 ;; -B) BUILD=$2; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "scaling: needs root (network namespaces)" >&2; exit 2; }
export CLUSTER_NAME=rrsc
CLUSTER=$ROOT/scripts/cluster
PERF=$BUILD/tools/ringreduce-perf
STREAM=$BUILD/bench/peers/tcp_stream
[ -x "$PERF" ] && [ -x "$STREAM" ] || { echo "scaling: build first ($PERF, $STREAM)" >&2; exit 2; }
# Debian's matplotlib, for Debian's python (a pyenv or venv python on PATH may lack it).
PY=/usr/bin/python3
if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y python3-matplotlib >&2 ||
    { echo "scaling: cannot install python3-matplotlib" >&2; exit 2; }
fi
mkdir -p "$OUT/raw"
trap '"$CLUSTER" down' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
say() { echo "[scaling $(date +%H:%M:%S)] $*" >&2; }

echo "hosts,algo,size_bytes,time_us,link_GBps" >"$OUT/scaling.csv"
for n in $NS; do
  "$CLUSTER" up "$n" --rate "$RATE" >&2 || exit 1
  # The link's single-flow rate, host 0 -> host 1, on this cluster.
  link=$("$STREAM" -t 3 -a 10.213.77.2 -R "/run/netns/${CLUSTER_NAME}h1" -S "/run/netns/${CLUSTER_NAME}h0" |
    sed -n 's/.*GB\/s=\([0-9.]*\).*/\1/p')
  say "N=$n: single flow $link GB/s"
  for algo in ring star; do
    raw=$OUT/raw/${algo}_N$n.txt
    "$CLUSTER" run --timeout 600 -- \
      "$PERF" allreduce -b "$SIZE" -e "$SIZE" -n "$ITERS" -w 1 --algorithm "$algo" -d float -o sum >"$raw" 2>&1 ||
      { tail -5 "$raw" >&2; say "N=$n $algo failed"; exit 1; }
    # Row: [0] size count type redop root time algbw busbw #wrong time ...: out of place, in place.
    awk -v n="$n" -v a="$algo" -v l="$link" '$1 == "[0]" && $2 ~ /^[0-9]+$/ {
        printf "%s,%s,%s,%s,%s\n%s,%s,%s,%s,%s\n", n, a, $2, $7, l, n, a, $2, $11, l }' "$raw" \
      >>"$OUT/scaling.csv"
    say "N=$n $algo: $(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ {print $7 " us (out of place), " $11 " us (in place)"}' "$raw")"
  done
done
"$PY" "$ROOT/bench/plots/plot_scaling.py" "$OUT/scaling.csv" "$PNG" "$RATE" >"$OUT/scaling.md" || exit 1
# The table and the data go beside the plot (docs/ by default).
DOCS=$(dirname "$PNG")
cp "$OUT/scaling.csv" "$DOCS/scaling.csv"
{
  echo "# Scaling: ring vs star allreduce on the emulated cluster"
  echo
  echo "Made by \`bench/drivers/scaling.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), git $(git rev-parse --short HEAD 2>/dev/null)"
  echo "($(nproc)-core machine; scripts/cluster, tbf-shaped links). Plot: $(basename "$PNG"); data: scaling.csv."
  echo
  cat "$OUT/scaling.md"
} >"$DOCS/scaling.md"
cat "$OUT/scaling.md"
say "done: $OUT, plot $PNG"
