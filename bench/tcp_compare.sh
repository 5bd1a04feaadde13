#!/usr/bin/env bash
# shellcheck disable=SC2086  # word splitting of pid and package lists is intended
# Compare ringreduce's allreduce over TCP loopback with peers measured in the same run:
#   ringreduce   RINGREDUCE_SHM=0 build/ringrun -n N build/ringreduce-perf allreduce ... (out of place)
#   gloo         Gloo AllreduceRingChunked, gloo::transport::tcp on 127.0.0.1  (bench/peers)
#   torch        torch.distributed all_reduce, backend gloo, /usr/bin/python3  (bench/peers)
#   mpi          OpenMPI MPI_Allreduce forced onto the TCP BTL over lo        (bench/peers)
#   tcp_stream   single-stream loopback TCP throughput, once per round        (bench/peers)
# For each N, ROUNDS interleaved rounds run every library once (the order rotates per round).
# Raw outputs go to OUTDIR/raw/, a log of every run to OUTDIR/runs.log, and the markdown table
# (best-of-rounds busbw, time for sizes <= 4 KiB, ratios ringreduce/Gloo and ringreduce/OpenMPI)
# made by bench/make_table.py to OUTDIR/table.md.
#
# usage: bench/tcp_compare.sh [-o OUTDIR] [-N "2 4"] [-r ROUNDS] [-b MIN] [-e MAX] [-f FACTOR]
#                             [-l "ringreduce gloo torch mpi"] [-t RUN_TIMEOUT_S] [-B BUILD_DIR]
#                             [-x "EXTRA PEER FLAGS"] [-j JOBS] [--no-install] [--no-build]
#   -x passes flags to the three peer programs only (e.g. -x "-T 0.5 -M 20000").
#   Environment: MPIRUN_EXTRA adds mpirun flags (e.g. "--mca mpi_yield_when_idle 1").
#   Placement: every library pins rank r to core r mod ncores (ringrun's default, mpirun's
#   --bind-to core, PEER_BIND=core for the Gloo and torch launchers); PEER_BIND=none and
#   MPI_BIND=none turn that off for the peers (and pass --bind none to ringrun yourself).
# Every process started here is bounded by `timeout` and killed on exit. Loopback traffic only.
#   Memory: every library's ranks run with glibc's malloc told to keep what it frees
#   (PEER_MALLOC=system: glibc's defaults): a peer that allocates a buffer per call would
#   otherwise pay this VM's 18 us page faults on every call (bench/shm_compare.sh says more).
set -euo pipefail
if [ "${PEER_MALLOC:-keep}" = keep ]; then
  export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736
fi
export PEER_BIND=${PEER_BIND:-core}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

OUT=/tmp/tcp_compare-$(date +%Y%m%d-%H%M%S)
NS="2 4"
ROUNDS=3
MIN=4
MAX=256M
FACTOR=4
LIBS="ringreduce gloo torch mpi"
RUN_TIMEOUT=600
BUILD=build
PEER_FLAGS=""
JOBS=$(nproc)
INSTALL=1
BUILD_STEP=1
PY=/usr/bin/python3

usage() { sed -n '3,19p' "$ROOT/bench/tcp_compare.sh" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -o) OUT=$2; shift 2 ;;
    -N) NS=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;;
    -b) MIN=$2; shift 2 ;;
    -e) MAX=$2; shift 2 ;;
    -f) FACTOR=$2; shift 2 ;;
    -l) LIBS=$2; shift 2 ;;
    -t) RUN_TIMEOUT=$2; shift 2 ;;
    -B) BUILD=$2; shift 2 ;;
    -x) PEER_FLAGS=$2; shift 2 ;;
    -j) JOBS=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --no-build) BUILD_STEP=0; shift ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done

RAW=$OUT/raw
LOG=$OUT/runs.log
mkdir -p "$RAW"
PEERS=$BUILD/bench/peers
say() { echo "[tcp_compare $(date +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }

# ---- cleanup: everything we start runs as CUR_PID (a `timeout` process) and its descendants ----
CUR_PID=""
descendants() {  # pids of the process tree under $1 (including $1), children first
  local p
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do descendants "$p"; done
  echo "$1"
}
kill_tree() {
  local root=$1 pids p alive=""
  [ -n "$root" ] && kill -0 "$root" 2>/dev/null || return 0
  pids=$(descendants "$root")
  kill -TERM $pids 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    alive=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -n "$alive" ] || return 0
    sleep 0.5
  done
  kill -KILL $alive 2>/dev/null || true
}
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$CUR_PID" ]; then
    say "stopping pid $CUR_PID and its children"
    kill_tree "$CUR_PID"
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run NAME SECONDS CMD...: stdout to RAW/NAME.txt, stderr to RAW/NAME.err; returns the exit code.
run() {
  local name=$1 secs=$2; shift 2
  local rc=0 t0 t1
  t0=$(date +%s.%N)
  echo "\$ $*" >"$RAW/$name.cmd"
  timeout -k 10 "$secs" "$@" >"$RAW/$name.txt" 2>"$RAW/$name.err" &
  CUR_PID=$!
  wait "$CUR_PID" || rc=$?
  CUR_PID=""
  t1=$(date +%s.%N)
  printf '%-24s rc=%-3s %6.1fs load=%s  %s\n' "$name" "$rc" "$(awk "BEGIN {print $t1 - $t0}")" \
    "$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ,)" "$*" >>"$LOG"
  if [ "$rc" -ne 0 ]; then
    say "$name failed (rc=$rc; 124/137 = timed out); stderr tail:"
    tail -n 5 "$RAW/$name.err" >&2 || true
  fi
  return "$rc"
}

# ---- 1. install what is missing ----
if [ "$INSTALL" = 1 ]; then
  missing=""
  for pkg in libgloo-dev libopenmpi-dev openmpi-bin python3-torch; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      missing="$missing $pkg"
  done
  if [ -n "$missing" ]; then
    say "installing:$missing"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    if ! timeout 1200 $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y $missing; then
      timeout 600 $SUDO apt-get update
      timeout 1200 $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y $missing
    fi
  fi
fi

# ---- 2. build ----
if [ "$BUILD_STEP" = 1 ]; then
  say "building in $BUILD"
  timeout 600 cmake -S . -B "$BUILD" -G Ninja >"$OUT/build.log" 2>&1 ||
    { tail -n 30 "$OUT/build.log" >&2; say "cmake failed (see $OUT/build.log)"; exit 1; }
  if ! timeout 3600 ninja -C "$BUILD" -j "$JOBS" >>"$OUT/build.log" 2>&1; then
    # The library is work in progress: still build what the peers need, and let the
    # ringreduce step skip itself if its binaries are missing.
    say "full build failed (see $OUT/build.log); building the peer programs only"
    tail -n 20 "$OUT/build.log" >&2
    for t in tcp_stream gloo_allreduce mpi_allreduce ringrun ringreduce-perf; do
      timeout 1800 ninja -C "$BUILD" -j "$JOBS" "$t" >>"$OUT/build.log" 2>&1 ||
        say "  target $t not built"
    done
  fi
fi

# ---- 3. record the setup ----
{
  echo "date: $(date -Is)"
  echo "host: $(uname -srm), $(nproc) cpus, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "sizes: -b $MIN -e $MAX -f $FACTOR; N: $NS; rounds: $ROUNDS; peer flags: ${PEER_FLAGS:-none}"
  echo "sysctl: $(sysctl -n net.ipv4.tcp_wmem net.ipv4.tcp_rmem net.core.wmem_max 2>/dev/null | tr '\n\t' '; ')"
  echo "malloc: ${GLIBC_TUNABLES:-glibc defaults}"
  for p in libgloo-dev openmpi-bin python3-torch; do
    echo "$p: $(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo missing)"
  done
} >"$OUT/setup.txt"
cat "$OUT/setup.txt" >&2

# ---- 4. runs ----
# shellcheck disable=SC2054,SC2206  # tcp,self is one argument; MPIRUN_EXTRA is split on purpose
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to "${MPI_BIND:-core:overload-allowed}"
        ${GLIBC_TUNABLES:+-x GLIBC_TUNABLES}
        --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo --mca coll ^sm ${MPIRUN_EXTRA:-})
SIZES=(-b "$MIN" -e "$MAX" -f "$FACTOR")
# shellcheck disable=SC2206
XF=($PEER_FLAGS)

find_bin() {  # the tools may land in the build root or in build/tools
  local d
  for d in "$BUILD" "$BUILD/tools"; do
    [ -x "$d/$1" ] && [ -f "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}

run_lib() {  # run_lib LIB N ROUND
  local lib=$1 n=$2 r=$3 name="${1}_N${2}_r${3}"
  case "$lib" in
    ringreduce)
      local ringrun perf
      if ! ringrun=$(find_bin ringrun) || ! perf=$(find_bin ringreduce-perf); then
        say "skip ringreduce: ringrun or ringreduce-perf not built yet (looked in $BUILD, $BUILD/tools)"
        return 0
      fi
      # Over TCP loopback: on one host the library would otherwise pick shared memory.
      RINGREDUCE_SHM=0 run "$name" "$RUN_TIMEOUT" "$ringrun" -n "$n" "$perf" allreduce "${SIZES[@]}" -d float -o sum ||
        true ;;
    gloo)
      if [ ! -x "$PEERS/gloo_allreduce" ]; then say "skip gloo: $PEERS/gloo_allreduce not built"; return 0; fi
      run "$name" "$RUN_TIMEOUT" "$PEERS/gloo_allreduce" -N "$n" "${SIZES[@]}" "${XF[@]}" || true ;;
    torch)
      if ! "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
        say "skip torch: $PY cannot import torch with gloo"; return 0
      fi
      run "$name" "$RUN_TIMEOUT" "$PY" bench/peers/torch_gloo.py -N "$n" "${SIZES[@]}" "${XF[@]}" || true ;;
    mpi)
      if [ ! -x "$PEERS/mpi_allreduce" ] || ! command -v mpirun >/dev/null; then
        say "skip mpi: $PEERS/mpi_allreduce or mpirun missing"; return 0
      fi
      run "$name" "$RUN_TIMEOUT" "${MPIRUN[@]}" -np "$n" "$PEERS/mpi_allreduce" "${SIZES[@]}" "${XF[@]}" || true ;;
    *) say "unknown library $lib" ;;
  esac
}

read -r -a LIBA <<<"$LIBS"
for n in $NS; do
  for r in $(seq 1 "$ROUNDS"); do
    say "N=$n round $r/$ROUNDS"
    k=${#LIBA[@]}
    for i in $(seq 0 $((k - 1))); do
      run_lib "${LIBA[$(((i + r - 1) % k))]}" "$n" "$r"
    done
    if [ -x "$PEERS/tcp_stream" ]; then
      run "tcp_stream_N${n}_r${r}" 60 "$PEERS/tcp_stream" -t 2 -s 4M || true
    fi
  done
done

# ---- 5. table ----
timeout 60 python3 bench/make_table.py "$OUT" >"$OUT/table.md"
cat "$OUT/table.md"
say "raw outputs in $RAW, run log $LOG, table $OUT/table.md"
