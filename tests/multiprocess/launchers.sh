#!/usr/bin/env bash
# Multi-process tests of real launches: every collective through ringrun at N=2 and 4, the
# mismatch error, and from_env under OpenMPI's mpirun and with torchrun's and Slurm's variables.
# Usage: launchers.sh CASE BUILD_DIR. Exit 77 = skipped. Every process is bounded by timeout and
# killed by pid on exit.
set -uo pipefail
case_name=$1
build=$2
ringrun=$build/tools/ringrun
perf=$build/tools/ringreduce-perf
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

case "$case_name" in
  collectives)
    for n in 2 4; do
      for coll in allreduce reduce_scatter allgather broadcast reduce alltoall; do
        out=$(timeout 120 "$ringrun" -n "$n" -- "$perf" "$coll" -b 4 -e 1M -f 32 -n 3 -w 1 -d all -o all -r $((n - 1)) 2>&1)
        rc=$?
        if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
          echo "FAILED: $coll at N=$n (rc $rc)"; echo "$out" | tail -30; exit 1
        fi
        echo "ok: $coll N=$n ($(grep -c '^\[0\]  ' <<<"$out") rows)"
      done
    done
    ;;
  mismatch)
    # Repeated, half of the runs with all four ranks on one core: how fast each rank learns of the
    # mismatch then varies, and every rank must still report it (not a neighbour's closed socket).
    for i in 1 2 3 4 5 6 7 8 9 10; do
      if [ $((i % 2)) -eq 0 ]; then pin=(taskset -c 0); bind=(--bind none); else pin=(); bind=(); fi
      out=$(timeout 60 "${pin[@]}" "$ringrun" "${bind[@]}" -n 4 -- "$build/tests/multiprocess/mismatch_rank" 2>&1)
      rc=$?
      echo "$out" | grep -v "WARN"
      [ $rc -eq 0 ] || { echo "FAILED: run $i: ringrun exited $rc"; exit 1; }
      for r in 0 1 2 3; do
        grep -q "^\[$r\] MismatchError" <<<"$out" || { echo "FAILED: run $i: rank $r has no MismatchError"; exit 1; }
      done
      # The message names both calls (the two counts) and both ranks.
      grep -q "float x 200000" <<<"$out" && grep -q "float x 100000" <<<"$out" || { echo "FAILED: calls not named"; exit 1; }
    done
    ;;
  mpirun)
    command -v mpirun >/dev/null || { echo "mpirun not installed: skipped"; exit 77; }
    port=$(free_port)
    out=$(timeout 120 mpirun --allow-run-as-root --oversubscribe -np 3 --mca btl self,tcp \
          -x RINGREDUCE_ADDR="127.0.0.1:$port" "$perf" allreduce -b 4 -e 1M -f 32 -n 3 -w 1 2>&1)
    rc=$?
    echo "$out"
    [ $rc -eq 0 ] && grep -q "3 ranks" <<<"$out" && grep -q "Out of bounds values : 0 OK" <<<"$out" || exit 1
    ;;
  torchrun|slurm)
    port=$(free_port)
    n=3
    for r in $(seq 0 $((n - 1))); do
      if [ "$case_name" = torchrun ]; then
        env -u RINGREDUCE_RANK RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n \
          MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
          timeout 120 "$perf" broadcast -b 4 -e 1M -f 32 -n 3 -w 1 -r 1 >"/tmp/rr_launch_$$_$r.log" 2>&1 &
      else
        env SLURM_PROCID=$r SLURM_NTASKS=$n SLURM_LOCALID=$r RINGREDUCE_ADDR=127.0.0.1:$port \
          timeout 120 "$perf" reduce -b 4 -e 1M -f 32 -n 3 -w 1 -r 2 >"/tmp/rr_launch_$$_$r.log" 2>&1 &
      fi
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    cat "/tmp/rr_launch_$$_0.log"
    grep -q "3 ranks" "/tmp/rr_launch_$$_0.log" && grep -q "Out of bounds values : 0 OK" "/tmp/rr_launch_$$_0.log" || rc=1
    rm -f /tmp/rr_launch_$$_*.log
    exit $rc
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
