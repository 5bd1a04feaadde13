#!/usr/bin/env bash
# shellcheck disable=SC2086  # word splitting of pid and package lists is intended
# Compare ringreduce's allreduce with other libraries measured in the same run, on one host,
# over one of two transports (once bench/shm_compare.sh and bench/tcp_compare.sh, which shared
# everything but the libraries, their launchers and the table).
#
# shm: where ranks can share memory.
#   ringreduce  build/tools/ringrun -n N build/tools/ringreduce-perf allreduce ...  (default
#               settings; the table uses the in-place columns: the reference numbers are in place)
#   registered  the same with --buffers registered (buffers from Communicator::alloc)
#   ompi        OpenMPI MPI_Allreduce with its defaults (no --mca restriction: on one host the
#               ob1 PML over the vader shared-memory BTL, as Debian's 4.1.4 picks), MPI_IN_PLACE:
#               mpirun --allow-run-as-root --oversubscribe --bind-to core:overload-allowed
#                 -np N build/bench/peers/mpi_allreduce ... -i 1
#   mpich       MPICH MPI_Allreduce with its defaults (ch4: its POSIX shared memory between
#               ranks of one host), MPI_IN_PLACE:
#               mpiexec.mpich -bind-to core -n N build/bench/peers/mpich_allreduce ... -i 1
#   stream      build/bench/stream_copy -t 1,NCORES (memory bandwidth of one and of all cores, for
#               each of its kernels: memcpy, non-temporal copy, rep movsb, a += b, c = a + b)
#   latency     build/bench/latency_floor -r 1 -p N (what a small allreduce cannot beat: one
#               exchange of a cache line between two cores, one process switch, and N pinned
#               processes exchanging lines when ranks share cores; the table compares the sizes
#               up to 64 B with it)
#   The table (bench/plots/make_shm_table.py): best-of-rounds busbw per size for each library,
#   time for sizes <= 4 KiB, ringreduce/better-MPI ratio, and for sizes >= 16 MiB ringreduce
#   against the memory-bandwidth limit defined here:
#
#   The ring's floor on one host is every rank reading its input once and writing its output
#   once: about 2 x size x N bytes of DRAM traffic per allreduce, whatever the algorithm does
#   in between (partial sums can stay in cache; at these sizes the buffers cannot). So
#     time_floor = 2 x size x N / stream_rw_bandwidth(all cores)
#   where stream_rw_bandwidth is stream_copy's best_GBps_rw with one thread per core (bytes
#   read + bytes written per second, the best of every round and of the kernels that move
#   memory fastest: non-temporal copy, rep movsb, a += b, c = a + b), and
#     fraction = time_floor / measured_time  (= ringreduce busbw / the busbw at time_floor).
#
# tcp: over TCP loopback.
#   ringreduce   RINGREDUCE_SHM=0 build/tools/ringrun -n N build/tools/ringreduce-perf allreduce ...
#                (out of place)
#   gloo         Gloo AllreduceRingChunked, gloo::transport::tcp on 127.0.0.1  (bench/peers)
#   torch        torch.distributed all_reduce, backend gloo, /usr/bin/python3  (bench/peers)
#   mpi          OpenMPI MPI_Allreduce forced onto the TCP BTL over lo        (bench/peers)
#   tcp_stream   single-stream loopback TCP throughput, once per round        (bench/peers)
#   The table (bench/plots/make_table.py): best-of-rounds busbw, time for sizes <= 4 KiB, ratios
#   ringreduce/Gloo and ringreduce/OpenMPI.
#
# For each N, ROUNDS interleaved rounds run every library once (the order rotates per round).
# Raw outputs go to OUTDIR/raw/, a log of every run to OUTDIR/runs.log, the table to
# OUTDIR/table.md.
#
# usage: bench/drivers/compare.sh shm|tcp [-o OUTDIR] [-N "2 4 8"] [-r ROUNDS] [-b MIN] [-e MAX]
#                             [-f FACTOR] [-l LIBRARIES] [-t RUN_TIMEOUT_S] [-B BUILD_DIR]
#                             [-x "EXTRA PEER FLAGS"] [-S STREAM_SIZE] [-j JOBS]
#                             [--no-install] [--no-build]
#   Defaults: -o /tmp/<shm|tcp>_compare-DATE -r 3 -b 4 -e 256M -f 4 -t 600 -B build -S 256M;
#   shm: -N "2 4 8" -l "ringreduce ompi mpich stream" (also: registered, latency);
#   tcp: -N "2 4" -l "ringreduce gloo torch mpi".
#   -x passes flags to the peer programs only (shm: the two MPI programs, e.g. -x "-T 0.1 -M
#   2000"; tcp: Gloo, torch and OpenMPI, e.g. -x "-T 0.5 -M 20000"). -S: shm's stream only.
#   Environment: MPIRUN_EXTRA adds mpirun flags (e.g. "--mca mpi_yield_when_idle 1"),
#   MPIEXEC_EXTRA mpiexec.mpich flags, RR_PERF_EXTRA ringreduce-perf flags (e.g.
#   "--time-per-size 0.1").
#   Placement: every library pins rank r to core r mod ncores (ringrun's default, mpirun's
#   --bind-to core:overload-allowed, mpiexec.mpich's -bind-to core if its hydra supports it,
#   PEER_BIND=core for the Gloo and torch launchers); MPI_BIND=none, MPICH_BIND=none and
#   PEER_BIND=none turn that off for the peers (and pass --bind none to ringrun yourself). A
#   library whose programs or launcher are missing is skipped, with a message. Every process
#   started here is bounded by `timeout` and killed on exit. Loopback traffic only.
#   Memory: every library's ranks run with glibc's malloc told to keep what it frees
#   (GLIBC_TUNABLES below; PEER_MALLOC=system leaves glibc's defaults). OpenMPI allocates a
#   temporary buffer per large allreduce, which glibc maps afresh each call; on a VM where a
#   page's first touch costs 18 us that was 0.28 s of every 64 MiB call (0.23 GB/s busbw at N = 2,
#   4.37 with the setting): a measure of the VM's page faults, not of the library.
set -euo pipefail
if [ "${PEER_MALLOC:-keep}" = keep ]; then
  export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736
fi
export PEER_BIND=${PEER_BIND:-core}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

# The usage: the header's lines from "usage:" to the end of the comment.
usage() {
  sed -n '/^# usage:/,/^[^#]/p' "$ROOT/bench/drivers/compare.sh" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}
TRANSPORT=${1:-}
case "$TRANSPORT" in
  shm) NS="2 4 8"; LIBS="ringreduce ompi mpich stream"
       PACKAGES="libopenmpi-dev openmpi-bin libmpich-dev mpich" ;;
  tcp) NS="2 4"; LIBS="ringreduce gloo torch mpi"
       PACKAGES="libgloo-dev libopenmpi-dev openmpi-bin python3-torch" ;;
  -h | --help) usage 0 ;;
  *) echo "the first argument is the transport: shm or tcp" >&2; usage 2 ;;
esac
shift

OUT=/tmp/${TRANSPORT}_compare-$(date +%Y%m%d-%H%M%S)
ROUNDS=3
MIN=4
MAX=256M
FACTOR=4
RUN_TIMEOUT=600
BUILD=build
PEER_FLAGS=""
STREAM_SIZE=256M
JOBS=$(nproc)
INSTALL=1
BUILD_STEP=1
NCORES=$(nproc)
PY=/usr/bin/python3

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
    -S) STREAM_SIZE=$2; shift 2 ;;
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
say() { echo "[compare $TRANSPORT $(date +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }

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

# ---- 1. install what is missing (a failure here only means some libraries get skipped) ----
if [ "$INSTALL" = 1 ]; then
  missing=""
  for pkg in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      missing="$missing $pkg"
  done
  if [ -n "$missing" ]; then
    say "installing:$missing"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    if ! timeout 1200 $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y $missing; then
      timeout 600 $SUDO apt-get update || true
      timeout 1200 $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y $missing ||
        say "could not install$missing; the libraries that need them will be skipped"
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
    say "full build failed (see $OUT/build.log); building the benchmark programs one by one"
    tail -n 20 "$OUT/build.log" >&2
    targets="mpi_allreduce ringrun ringreduce-perf"
    [ "$TRANSPORT" = shm ] && targets="$targets stream_copy latency_floor mpich_allreduce"
    [ "$TRANSPORT" = tcp ] && targets="$targets tcp_stream gloo_allreduce"
    for t in $targets; do
      timeout 1800 ninja -C "$BUILD" -j "$JOBS" "$t" >>"$OUT/build.log" 2>&1 ||
        say "  target $t not built"
    done
  fi
fi

# ---- 3. record the setup ----
MPICH_BIND_ARGS=()
MPICH_BIND=${MPICH_BIND:-core}
MPICH_PLACEMENT=unpinned
if [ "$TRANSPORT" = shm ]; then
  command -v mpiexec.mpich >/dev/null || MPICH_PLACEMENT="(mpiexec.mpich missing)"
  if command -v mpiexec.mpich >/dev/null && [ "$MPICH_BIND" != none ]; then
    if timeout 30 mpiexec.mpich -bind-to "$MPICH_BIND" -n 1 true >/dev/null 2>&1; then
      MPICH_BIND_ARGS=(-bind-to "$MPICH_BIND")
      MPICH_PLACEMENT="-bind-to $MPICH_BIND"
    else
      say "mpiexec.mpich does not take -bind-to $MPICH_BIND: MPICH ranks run unpinned"
    fi
  fi
fi
{
  echo "transport: $TRANSPORT"
  echo "date: $(date -Is)"
  echo "host: $(uname -srm), $(nproc) cpus, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "sizes: -b $MIN -e $MAX -f $FACTOR; N: $NS; rounds: $ROUNDS; peer flags: ${PEER_FLAGS:-none}"
  if [ "$TRANSPORT" = shm ]; then
    echo "stream: stream_copy -s $STREAM_SIZE -t 1,$NCORES"
    echo "placement: ringrun default; mpirun --bind-to ${MPI_BIND:-core:overload-allowed}; mpiexec.mpich $MPICH_PLACEMENT"
  else
    echo "sysctl: $(sysctl -n net.ipv4.tcp_wmem net.ipv4.tcp_rmem net.core.wmem_max 2>/dev/null | tr '\n\t' '; ')"
  fi
  echo "malloc: ${GLIBC_TUNABLES:-glibc defaults}"
  for p in $PACKAGES; do
    case "$p" in libopenmpi-dev | mpich) continue ;; esac  # openmpi-bin and libmpich-dev say it
    echo "$p: $(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo missing)"
  done
} >"$OUT/setup.txt"
cat "$OUT/setup.txt" >&2

# ---- 4. runs ----
# shellcheck disable=SC2206  # MPIRUN_EXTRA / MPIEXEC_EXTRA / RR_PERF_EXTRA are split on purpose
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to "${MPI_BIND:-core:overload-allowed}"
        ${GLIBC_TUNABLES:+-x GLIBC_TUNABLES})
# Over TCP, OpenMPI is kept off its shared-memory paths.
# shellcheck disable=SC2054  # tcp,self is one argument
[ "$TRANSPORT" = tcp ] && MPIRUN+=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo
                                   --mca oob_tcp_if_include lo --mca coll ^sm)
# shellcheck disable=SC2206
MPIRUN+=(${MPIRUN_EXTRA:-})
# shellcheck disable=SC2206
MPIEXEC=(mpiexec.mpich "${MPICH_BIND_ARGS[@]}" ${MPIEXEC_EXTRA:-})
# shellcheck disable=SC2206
RR_EXTRA=(${RR_PERF_EXTRA:-})
SIZES=(-b "$MIN" -e "$MAX" -f "$FACTOR")
# shellcheck disable=SC2206
XF=($PEER_FLAGS)

find_bin() {  # the tools may land in the build root or in build/tools
  local d
  for d in "$BUILD/tools" "$BUILD"; do
    [ -x "$d/$1" ] && [ -f "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}

run_lib() {  # run_lib LIB N ROUND
  local lib=$1 n=$2 r=$3 name="${1}_N${2}_r${3}"
  local ringrun perf
  case "$TRANSPORT:$lib" in
    *:ringreduce | shm:registered)
      if ! ringrun=$(find_bin ringrun) || ! perf=$(find_bin ringreduce-perf); then
        say "skip $lib: ringrun or ringreduce-perf not built (looked in $BUILD/tools, $BUILD)"
        return 0
      fi
      local how=()
      # registered: on buffers from Communicator::alloc (registered with the host's ranks)
      [ "$lib" = registered ] && how=(--buffers registered)
      # Over TCP loopback: on one host the library would otherwise pick shared memory.
      local env=()
      [ "$TRANSPORT" = tcp ] && env=(env RINGREDUCE_SHM=0)
      run "$name" "$RUN_TIMEOUT" "${env[@]}" "$ringrun" -n "$n" "$perf" allreduce "${SIZES[@]}" \
        -d float -o sum "${how[@]}" "${RR_EXTRA[@]}" || true ;;
    shm:ompi | tcp:mpi)
      if [ ! -x "$PEERS/mpi_allreduce" ] || ! command -v mpirun >/dev/null; then
        say "skip $lib: $PEERS/mpi_allreduce or mpirun missing (apt-get install libopenmpi-dev openmpi-bin)"
        return 0
      fi
      local in_place=()
      [ "$TRANSPORT" = shm ] && in_place=(-i 1)
      run "$name" "$RUN_TIMEOUT" "${MPIRUN[@]}" -np "$n" "$PEERS/mpi_allreduce" "${SIZES[@]}" \
        "${in_place[@]}" "${XF[@]}" || true ;;
    shm:mpich)
      if [ ! -x "$PEERS/mpich_allreduce" ] || ! command -v mpiexec.mpich >/dev/null; then
        say "skip mpich: $PEERS/mpich_allreduce or mpiexec.mpich missing (apt-get install libmpich-dev)"
        return 0
      fi
      run "$name" "$RUN_TIMEOUT" "${MPIEXEC[@]}" -n "$n" "$PEERS/mpich_allreduce" "${SIZES[@]}" \
        -i 1 "${XF[@]}" || true ;;
    shm:stream)
      if [ ! -x "$BUILD/bench/stream_copy" ]; then
        say "skip stream: $BUILD/bench/stream_copy not built"; return 0
      fi
      local tl=1
      [ "$NCORES" -gt 1 ] && tl="1,$NCORES"
      run "$name" "$RUN_TIMEOUT" "$BUILD/bench/stream_copy" -s "$STREAM_SIZE" -t "$tl" || true ;;
    shm:latency)
      if [ ! -x "$BUILD/bench/latency_floor" ]; then
        say "skip latency: $BUILD/bench/latency_floor not built"; return 0
      fi
      run "$name" "$RUN_TIMEOUT" "$BUILD/bench/latency_floor" -r 1 -p "$n" || true ;;
    tcp:gloo)
      if [ ! -x "$PEERS/gloo_allreduce" ]; then say "skip gloo: $PEERS/gloo_allreduce not built"; return 0; fi
      run "$name" "$RUN_TIMEOUT" "$PEERS/gloo_allreduce" -N "$n" "${SIZES[@]}" "${XF[@]}" || true ;;
    tcp:torch)
      if ! "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
        say "skip torch: $PY cannot import torch with gloo"; return 0
      fi
      run "$name" "$RUN_TIMEOUT" "$PY" bench/peers/torch_gloo.py -N "$n" "${SIZES[@]}" "${XF[@]}" || true ;;
    *) say "unknown library $lib (over $TRANSPORT)" ;;
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
    if [ "$TRANSPORT" = tcp ] && [ -x "$PEERS/tcp_stream" ]; then
      run "tcp_stream_N${n}_r${r}" 60 "$PEERS/tcp_stream" -t 2 -s 4M || true
    fi
  done
done

# ---- 5. table ----
if [ "$TRANSPORT" = shm ]; then
  timeout 60 python3 bench/plots/make_shm_table.py "$OUT" >"$OUT/table.md"
else
  timeout 60 python3 bench/plots/make_table.py "$OUT" >"$OUT/table.md"
fi
cat "$OUT/table.md"
say "raw outputs in $RAW, run log $LOG, table $OUT/table.md"
