#!/usr/bin/env bash
# Start-up at scale on this host: for each N, `ringrun -n N --store-stats` of
# ringreduce-startup (bench/drivers/startup.cc: launch to communicator ready and to the first allreduce
# done, slowest rank, then a barrier, an allreduce and an alltoall checked), and the requests
# the store served, per rank. With -g, torch's gloo backend does the same through
# bench/drivers/torch_startup.py (init_process_group + one allreduce + barrier) at the sizes in -G.
# Rounds are interleaved (N1 N2 ... then again); the table keeps the best and the spread.
# With -c HOSTS, ringreduce's ranks are spread over HOSTS emulated hosts instead (scripts/cluster,
# 10 Gbit/s links; root): N/HOSTS per host, shared memory within a host and TCP between them,
# launched by one `ringrun --nnodes HOSTS --node-rank I` per host (-L cluster: by `scripts/cluster
# run`, a process per rank from a shell, and no store counts). -A: no alltoall in the checks
# (over TCP it connects every pair of ranks on different hosts).
#
# usage: bench/drivers/startup.sh [-N "16 32 64 128 256"] [-r ROUNDS] [-g] [-G "16 32 64"]
#                         [-c HOSTS] [-L ringrun|cluster] [-A] [-o OUTDIR] [-p PNG] [-B BUILD_DIR]
# Writes OUTDIR/startup.csv, OUTDIR/startup.md and, with python3-matplotlib, the plot PNG
# (default docs/startup.png).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NS="16 32 64 128 256" ROUNDS=3 GLOO=0 GLOO_NS="16 32 64" HOSTS=0 OUT=/tmp/startup-$(date +%Y%m%d-%H%M%S)
LAUNCH=ringrun PROG_ARGS=()
PNG=$ROOT/docs/startup.png BUILD=$ROOT/build
while [ $# -gt 0 ]; do
  case "$1" in
    -N) NS=$2; shift 2 ;; -r) ROUNDS=$2; shift 2 ;; -g) GLOO=1; shift ;; -G) GLOO_NS=$2; shift 2 ;;
    -c) HOSTS=$2; shift 2 ;; -o) OUT=$2; shift 2 ;; -p) PNG=$2; shift 2 ;; -B) BUILD=$2; shift 2 ;;
    -L) LAUNCH=$2; shift 2 ;; -A) PROG_ARGS=(--no-alltoall); shift ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
RINGRUN=$BUILD/tools/ringrun
PROG=$BUILD/bench/ringreduce-startup
[ -x "$RINGRUN" ] && [ -x "$PROG" ] || { echo "startup: build first ($RINGRUN, $PROG)" >&2; exit 2; }
mkdir -p "$OUT"
# Every rank holds a few descriptors per same-host peer.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[[ $HOSTS =~ ^[0-9]+$ ]] || { echo "startup: -c wants a number of hosts, not '$HOSTS'" >&2; exit 2; }
case "$LAUNCH" in ringrun | cluster) ;; *) echo "startup: -L is ringrun or cluster, not '$LAUNCH'" >&2; exit 2 ;; esac
if [ "$HOSTS" -gt 0 ]; then
  for n in $NS; do
    [ $((n % HOSTS)) -eq 0 ] && [ "$n" -ge "$HOSTS" ] ||
      { echo "startup: $n ranks do not split evenly over $HOSTS hosts" >&2; exit 2; }
  done
  # A cluster of its own, taken down on the way out.
  export CLUSTER_NAME=rrsb
  trap '"$ROOT/scripts/cluster" down >/dev/null 2>&1' EXIT
  "$ROOT/scripts/cluster" up "$HOSTS" --rate 10gbit || exit 1
fi
csv=$OUT/startup.csv
echo "lib,n,round,ready_s,first_allreduce_s,last_start_s,wall_s,store_requests,requests_per_rank,check" >"$csv"

# per_host N: one ringrun per emulated host, each starting its N/HOSTS ranks; host 0's hosts the
# store (on host 0's address) and prints the result. Its status is the first failure's.
per_host() {
  local n=$1 h pids=() rc=0 code
  for h in $(seq 0 $((HOSTS - 1))); do
    "$ROOT/scripts/cluster" exec "$h" -- "$RINGRUN" -n $((n / HOSTS)) --nnodes "$HOSTS" \
      --node-rank "$h" --master 10.213.77.1:29500 --timeout 300 $([ "$h" = 0 ] && echo --store-stats) \
      -- "$PROG" "${PROG_ARGS[@]}" >"$OUT/host$h.log" 2>&1 &
    pids+=($!)
  done
  for h in "${!pids[@]}"; do
    wait "${pids[$h]}"
    code=$?
    [ $code -ne 0 ] && [ $rc -eq 0 ] && rc=$code && tail -5 "$OUT/host$h.log" >&2
  done
  cat "$OUT/host0.log"
  return $rc
}

# run_one LIB N ROUND: one launch of LIB (ringreduce or gloo) at N ranks, a CSV row.
run_one() {
  local lib=$1 n=$2 round=$3 t0 t1 out line req="" per="" wall
  local cmd=("$RINGRUN" -n "$n" --store-stats --timeout 300 -- "$PROG" "${PROG_ARGS[@]}")
  [ "$lib" = gloo ] && cmd=("$RINGRUN" -n "$n" --timeout 300 -- /usr/bin/python3 "$ROOT/bench/drivers/torch_startup.py")
  if [ "$HOSTS" -gt 0 ] && [ "$lib" != gloo ]; then
    lib="ringreduce-${HOSTS}hosts"
    cmd=(per_host "$n")
    [ "$LAUNCH" = cluster ] &&
      cmd=("$ROOT/scripts/cluster" run --ranks-per-host $((n / HOSTS)) --timeout 300 -- "$PROG" "${PROG_ARGS[@]}")
  fi
  t0=$(date +%s.%N)
  out=$("${cmd[@]}" 2>&1)
  local rc=$?
  t1=$(date +%s.%N)
  wall=$(echo "$t1 - $t0" | bc)
  line=$(grep -m1 "startup N=" <<<"$out" | sed 's/^\[0\] //')
  [ "$lib" != gloo ] && req=$(sed -n 's/.*the store served \([0-9]*\) requests.*/\1/p' <<<"$out" | tail -1)
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    echo "$lib N=$n round $round: FAILED (rc $rc)"; echo "$out" | tail -20
    echo "$lib,$n,$round,,,,$wall,$req,,failed" >>"$csv"
    return
  fi
  read -r ready first last check < <(awk '{for (i=1;i<=NF;i++) {if ($i=="ready") r=$(i+1);
    if ($i=="first_allreduce") f=$(i+1); if ($i=="last_start") l=$(i+1); if ($i=="check") c=$(i+1)}}
    END {print r, f, l, c}' <<<"$line")
  [ -n "$req" ] && per=$(echo "scale=1; $req / $n" | bc)
  echo "$lib N=$n round $round: $line;${req:+ store $req requests;} wall $(printf %.2f "$wall") s"
  echo "$lib,$n,$round,$ready,$first,$last,$wall,$req,$per,$check" >>"$csv"
}

for round in $(seq 1 "$ROUNDS"); do
  for n in $NS; do run_one ringreduce "$n" "$round"; done
  if [ "$GLOO" = 1 ]; then for n in $GLOO_NS; do run_one gloo "$n" "$round"; done; fi
done

# The table: per library and N, the best round's first allreduce (and the spread over rounds).
/usr/bin/python3 - "$csv" "$OUT/startup.md" <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["check"] == "ok"]
by = {}
for r in rows:
    by.setdefault((r["lib"], int(r["n"])), []).append(r)
lines = ["| library | N | launch to first allreduce, best (s) | spread over rounds (s) | ready (s) | last process started (s) | store requests per rank |",
         "|---|---|---|---|---|---|---|"]
for (lib, n), rs in sorted(by.items()):
    best = min(rs, key=lambda r: float(r["first_allreduce_s"]))
    firsts = sorted(float(r["first_allreduce_s"]) for r in rs)
    lines.append(f"| {lib} | {n} | {float(best['first_allreduce_s']):.2f} | {firsts[0]:.2f}-{firsts[-1]:.2f} ({len(rs)} rounds) | "
                 f"{float(best['ready_s']):.2f} | {float(best['last_start_s']):.2f} | {best['requests_per_rank'] or '-'} |")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
# The plot says where and when it was measured: machine, cores, date, version (bench/plots/plot_caption.py).
setting="one host"
[ "$HOSTS" -gt 0 ] && setting="ringreduce over $HOSTS emulated hosts at 10 Gbit/s"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  /usr/bin/python3 "$ROOT/bench/plots/plot_startup.py" "$csv" "$PNG" --setting "$setting"
else
  echo "(no plot: python3-matplotlib is not installed)"
fi
