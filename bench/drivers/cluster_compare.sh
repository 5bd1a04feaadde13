#!/usr/bin/env bash
# shellcheck disable=SC2086  # word splitting of lists is intended
# Allreduce across an emulated cluster (scripts/cluster: one network namespace per host, links
# shaped with tbf), ringreduce beside peers measured in the same run:
#   ringreduce   ringreduce-perf allreduce, one rank per host (scripts/cluster run)
#   gloo         Gloo AllreduceRingChunked over gloo::transport::tcp on each host's address
#   mpi          OpenMPI MPI_Allreduce, default algorithm choice, TCP BTL on eth0 (mpirun on host
#                0 starts the others through an rsh agent that enters their namespaces)
#   mpiring      the same with coll_tuned's ring forced (coll_tuned_allreduce_algorithm 4)
#   tcp_stream   one TCP stream host 0 -> host 1 (the link's single-flow rate), once per round
# ROUNDS interleaved rounds run every library once each (the order rotates per round). Raw
# outputs go to OUTDIR/raw/<lib>_N<hosts>_r<round>.txt, the table (bench/plots/make_table.py) to
# OUTDIR/table.md. Float32 sum, out of place.
#
# usage: bench/drivers/cluster_compare.sh [-o OUTDIR] [-H HOSTS] [-R RATE] [-r ROUNDS] [-b MIN] [-e MAX]
#                                 [-f FACTOR] [-l "ringreduce gloo mpi mpiring"] [-t RUN_TIMEOUT_S]
#                                 [-B BUILD_DIR] [-x "EXTRA PEER FLAGS"] [-E "VAR=VALUE ..."]
#   -E sets variables for ringreduce's ranks only (e.g. -E "RINGREDUCE_NSOCKS=2").
# Needs root. The cluster is brought up here and taken down on exit, whatever happens.
# Every library runs with glibc keeping freed memory (PEER_MALLOC=system: glibc's defaults),
# as in bench/drivers/compare.sh shm: a per-call buffer would otherwise measure this VM's page faults.
set -uo pipefail
if [ "${PEER_MALLOC:-keep}" = keep ]; then
  export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=/tmp/cluster_compare-$(date +%Y%m%d-%H%M%S)
HOSTS=4 RATE=1gbit ROUNDS=3 MIN=4 MAX=256M FACTOR=4 LIBS="ringreduce gloo mpi mpiring"
RUN_TIMEOUT=900 BUILD=build PEER_FLAGS="" RR_ENV=""
usage() { sed -n '3,21p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -o) OUT=$2; shift 2 ;; -H) HOSTS=$2; shift 2 ;; -R) RATE=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;; -b) MIN=$2; shift 2 ;; -e) MAX=$2; shift 2 ;;
    -f) FACTOR=$2; shift 2 ;; -l) LIBS=$2; shift 2 ;; -t) RUN_TIMEOUT=$2; shift 2 ;;
    -B) BUILD=$2; shift 2 ;; -x) PEER_FLAGS=$2; shift 2 ;; -E) RR_ENV=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "cluster_compare: needs root (network namespaces)" >&2; exit 2; }
export CLUSTER_NAME=rrcc
CLUSTER=$ROOT/scripts/cluster
RAW=$OUT/raw
LOG=$OUT/runs.log
mkdir -p "$RAW"
work=$(mktemp -d)
say() { echo "[cluster_compare $(date +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }
trap '"$CLUSTER" down; rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$CLUSTER" up "$HOSTS" --rate "$RATE" | tee -a "$LOG" >&2 || exit 1
{
  echo "date: $(date -Is)"
  echo "host: $(uname -srm), $(nproc) cpus; cluster: $HOSTS hosts, $RATE each way (tbf), one rank per host"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "sizes: -b $MIN -e $MAX -f $FACTOR; rounds: $ROUNDS; peer flags: ${PEER_FLAGS:-none}; ringreduce env: ${RR_ENV:-none}"
  echo "tcp congestion control: $(ip netns exec ${CLUSTER_NAME}h0 sysctl -n net.ipv4.tcp_congestion_control)"
  echo "malloc: ${GLIBC_TUNABLES:-glibc defaults}"
  for p in libgloo-dev openmpi-bin; do echo "$p: $(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo missing)"; done
} >"$OUT/setup.txt"
cat "$OUT/setup.txt" >&2

# mpirun's daemons reach the other hosts through scripts/cluster's agent, as through ssh.
"$CLUSTER" hostfile 1 >"$work/hosts"

SIZES=(-b "$MIN" -e "$MAX" -f "$FACTOR")
XF=($PEER_FLAGS)
PEERS=$BUILD/bench/peers
run() {  # run NAME CMD...: stdout to RAW/NAME.txt, stderr to RAW/NAME.err
  local name=$1 rc=0 t0
  shift
  t0=$(date +%s)
  echo "\$ $*" >"$RAW/$name.cmd"
  timeout -k 10 "$RUN_TIMEOUT" "$@" >"$RAW/$name.txt" 2>"$RAW/$name.err" || rc=$?
  printf '%-22s rc=%-3s %5ss  %s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$*" >>"$LOG"
  [ "$rc" -eq 0 ] || { say "$name failed (rc $rc)"; tail -n 5 "$RAW/$name.err" >&2; }
}
run_lib() {  # LIB ROUND
  local lib=$1 r=$2 name="${1}_N${HOSTS}_r${2}"
  local env_args=() v
  for v in $RR_ENV; do env_args+=(--env "$v"); done
  case "$lib" in
    ringreduce)
      run "$name" "$CLUSTER" run --timeout "$RUN_TIMEOUT" "${env_args[@]}" -- \
        "$BUILD/tools/ringreduce-perf" allreduce "${SIZES[@]}" -d float -o sum
      sed -i -n 's/^\[0\] //p' "$RAW/$name.txt" ;;
    gloo)
      [ -x "$PEERS/gloo_allreduce" ] || { say "skip gloo: $PEERS/gloo_allreduce not built (libgloo-dev)"; return; }
      local store="$work/gloo_$r"
      rm -rf "$store" && mkdir -p "$store"
      run "$name" "$CLUSTER" run --launcher torchrun --timeout "$RUN_TIMEOUT" -- sh -c \
        'PEER_HOSTNAME=$CLUSTER_ADDR exec "$@"' sh "$PEERS/gloo_allreduce" -s "$store" "${SIZES[@]}" "${XF[@]}"
      sed -i -n 's/^\[0\] //p' "$RAW/$name.txt" ;;
    mpi | mpiring)
      [ -x "$PEERS/mpi_allreduce" ] || { say "skip $lib: $PEERS/mpi_allreduce not built"; return; }
      local extra=()
      [ "$lib" = mpiring ] && extra=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)
      run "$name" ip netns exec "${CLUSTER_NAME}h0" mpirun --allow-run-as-root -np "$HOSTS" \
        ${GLIBC_TUNABLES:+-x GLIBC_TUNABLES} \
        --hostfile "$work/hosts" --mca plm_rsh_agent "$CLUSTER agent" --mca pml ob1 --mca btl tcp,self \
        --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "${extra[@]}" \
        "$PEERS/mpi_allreduce" "${SIZES[@]}" "${XF[@]}" ;;
    *) say "unknown library $lib" ;;
  esac
}

libs=($LIBS)
for r in $(seq 1 "$ROUNDS"); do
  say "round $r of $ROUNDS"
  run "tcp_stream_N${HOSTS}_r$r" "$PEERS/tcp_stream" -t 3 -a 10.213.77.2 -R "/run/netns/${CLUSTER_NAME}h1" \
    -S "/run/netns/${CLUSTER_NAME}h0"
  for k in "${!libs[@]}"; do
    run_lib "${libs[$(((k + r - 1) % ${#libs[@]}))]}" "$r"
  done
done
python3 "$ROOT/bench/plots/make_table.py" "$OUT" >"$OUT/table.md" && cat "$OUT/table.md"
say "done: $OUT"
