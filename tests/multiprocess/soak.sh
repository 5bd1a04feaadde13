#!/usr/bin/env bash
# Soak (issue 6 item 8): four ranks of soak_rank (soak_rank.cc) under ringrun run random
# collectives (every kind, dtype, reduce op, root; 0 to 4 MiB, log-uniform; in place and out of
# place; blocking and async with up to 4 outstanding), check every result exactly, and check that
# descriptors and threads are the same at the end as after the warm-up (the first 10% of the ops)
# and after destroying the communicator as before creating it, and that RSS and heap in use grew
# less than their bounds. Nothing may be left in /dev/shm.
#
# Usage: soak.sh short|long|selftest BUILD_DIR [shm|tcp|mix] [SEED]
#   short     2,000 ops (ctest: soak.short-shm, soak.short-tcp), 2-4 s on 2 idle cores
#   long      5,000 ops (SOAK_OPS overrides), the run for the reliability note
#   selftest  the checks themselves (ctest: soak.selftest): rank 1 injects one fault of each kind
#             (a wrong result, an overwritten guard byte, a leaked descriptor, thread, 1 MiB of
#             heap, 16 MiB of RSS) into a 100-op run, which must fail with the matching message
#   shm    one host, shared memory (the default); tcp: RINGREDUCE_SHM=0, loopback TCP;
#   mix    two emulated hosts (RINGREDUCE_HOST_ID by rank parity): shared memory and TCP at once
#   SEED   the ops' random sequence; default: SOAK_SEED, else the time. A failure prints the
#          command that repeats the same run.
# Every process is bounded by timeout (ringrun --timeout, and timeout around ringrun) and killed
# by pid on exit.
set -uo pipefail
case_name=${1:-}
build=${2:-}
transport=${3:-shm}
seed=${4:-${SOAK_SEED:-$(date +%s)}}
case "$case_name" in
  short) ops=2000 limit=90 ;;
  long) ops=${SOAK_OPS:-5000} limit=1500 ;;
  selftest) ops=100 limit=60 ;;
  *) echo "usage: soak.sh short|long|selftest BUILD_DIR [shm|tcp|mix] [SEED]"; exit 2 ;;
esac
case "$transport" in
  shm) envs=(RINGREDUCE_SHM=1) ;;
  tcp) envs=(RINGREDUCE_SHM=0) ;;
  mix) envs=(RINGREDUCE_SHM=1) ;;
  *) echo "unknown transport $transport (shm, tcp or mix)"; exit 2 ;;
esac
ringrun=$build/tools/ringrun
rank_bin=$build/tests/multiprocess/soak_rank
[ -x "$ringrun" ] && [ -x "$rank_bin" ] || { echo "FAILED: no $ringrun or $rank_bin"; exit 1; }

log=$(mktemp /tmp/rr_soak_XXXXXX)
pid=
# $pid is `timeout`, whose child is ringrun: SIGTERM to timeout reaches ringrun, which stops its
# ranks (SIGTERM, then SIGKILL after its grace); SIGKILL to timeout would orphan ringrun.
cleanup() {
  if [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$log"
}
trap cleanup EXIT

if [ "$case_name" = selftest ]; then
  declare -A want=(
    [result]="FAIL rank 1: op [0-9]+ .*\\[[0-9]+\\] = .*, expected .* \\(1 of [0-9]+ elements wrong\\)"
    [guard]="FAIL rank 1: op [0-9]+ .*: the byte 3 after the [0-9]+ bytes of recv was overwritten"
    [fd]="FAIL rank 1: descriptors changed between the warm-up and the end"
    [thread]="FAIL rank 1: threads changed between the warm-up and the end"
    [heap]="FAIL rank 1: heap in use grew past its bound"
    [rss]="FAIL rank 1: RSS grew past its bound"
  )
  fail=0
  for kind in result guard fd thread heap rss; do
    env "${envs[@]}" timeout -k 5 $((limit + 20)) "$ringrun" --timeout "$limit" -n 4 -- \
      "$rank_bin" --ops "$ops" --seed "$seed" --inject "$kind" >"$log" 2>&1 &
    pid=$!
    wait "$pid"
    rc=$?
    pid=
    line=$(grep -E "^\[1\] ${want[$kind]}$" "$log" | head -1)
    if [ "$rc" -ne 0 ] && [ -n "$line" ] && grep -q "^\[1\] SOAK rank 1: FAILED$" "$log"; then
      echo "ok: $kind caught: $line"
    else
      echo "FAILED: injected $kind not caught as expected (ringrun exited $rc); the job's output:"
      grep -v "progress: " "$log" | tail -60; fail=1
    fi
  done
  [ $fail -eq 0 ] || { echo "repeat with: $0 selftest $build $transport $seed"; exit 1; }
  echo "ok: soak selftest, every injected fault caught"
  exit 0
fi

cmd=("$rank_bin" --ops "$ops" --seed "$seed")
if [ "$transport" = mix ]; then
  cmd=(sh -c 'RINGREDUCE_HOST_ID=h$((RINGREDUCE_RANK % 2)) exec "$@"' sh "${cmd[@]}")
fi
echo "soak $case_name: $ops ops, N=4, $transport, seed $seed ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
before=$(ls /dev/shm 2>/dev/null | sort)
start=$(date +%s.%N)
# ringrun tears the job down at its own timeout; the outer timeout is for ringrun itself.
env "${envs[@]}" timeout -k 5 $((limit + 20)) "$ringrun" --timeout "$limit" -n 4 -- "${cmd[@]}" >"$log" 2>&1 &
pid=$!
wait "$pid"
rc=$?
pid=
wall=$(echo "$(date +%s.%N) - $start" | bc)
after=$(ls /dev/shm 2>/dev/null | sort)

grep -E "SOAK|FAIL|progress|ERROR" "$log"
fail=0
[ "$rc" -eq 0 ] || { echo "FAILED: ringrun exited $rc"; fail=1; }
for r in 0 1 2 3; do
  grep -q "^\[$r\] SOAK rank $r: $ops ops in " "$log" || { echo "FAILED: rank $r did not finish its ops"; fail=1; }
  grep -q "^\[$r\] SOAK rank $r: OK$" "$log" || { echo "FAILED: rank $r did not pass"; fail=1; }
done
# The library names nothing in /dev/shm (memfd segments): anything new there is left behind.
new=$(comm -13 <(echo "$before") <(echo "$after"))
[ -z "$new" ] || { echo "FAILED: new in /dev/shm: $new"; fail=1; }
printf "wall %.1f s\n" "$wall"
if [ $fail -ne 0 ]; then
  echo "--- the last 60 lines of the job's output:"
  tail -60 "$log"
  echo "repeat with: $0 $case_name $build $transport $seed"
  exit 1
fi
echo "ok: soak $case_name $transport, $ops ops, seed $seed"
