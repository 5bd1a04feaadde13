#!/usr/bin/env bash
# Multi-process tests of real launches: every collective through ringrun at N=2 and 4 (and over
# two emulated hosts), the mismatch error, a rank killed or stopped in the middle of every
# collective (shm, tcp, both), start-up faults across processes (a rank out of range, a bad
# setting, a reused store), and from_env under OpenMPI's mpirun and with torchrun's and Slurm's
# variables.
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
        # At N = 2 every dtype x op in the allreduce and the other collectives every dtype with
        # sum; at N = 4 float (the in-process matrix runs every collective x dtype x op at 1-9
        # ranks: what this adds is ranks that are processes).
        ops=sum dtypes=all
        [ "$coll" = allreduce ] && ops=all
        [ "$n" = 4 ] && dtypes=float
        out=$(timeout 120 "$ringrun" -n "$n" -- "$perf" "$coll" -b 4 -e 1M -f 32 -n 3 -w 1 -d $dtypes -o $ops -r $((n - 1)) 2>&1)
        rc=$?
        if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
          echo "FAILED: $coll at N=$n (rc $rc)"; echo "$out" | tail -30; exit 1
        fi
        echo "ok: $coll N=$n ($(grep -c '^\[0\]  ' <<<"$out") rows)"
      done
    done
    # Registered memory across processes (each rank maps its peers' allocations through /proc):
    # every dtype x op, sizes whose slices do not divide evenly, the registered algorithm on every
    # row.
    for n in 2 3; do
      out=$(timeout 120 "$ringrun" -n "$n" -- "$perf" allreduce -b 100K -e 1600K -f 16 -n 1 -w 1 -d all -o all \
            --buffers registered 2>&1)
      rc=$?
      rows=$(grep -c '^\[0\]  ' <<<"$out")
      if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out" ||
         [ "$(grep -c ' registered seg=' <<<"$out")" -ne "$rows" ]; then
        echo "FAILED: allreduce in registered memory at N=$n (rc $rc)"; echo "$out" | tail -30; exit 1
      fi
      echo "ok: allreduce in registered memory N=$n ($rows rows)"
    done
    ;;
  mixhosts)
    # Two emulated hosts (RINGREDUCE_HOST_ID by rank parity): ranks 0 and 2 share memory, so do 1
    # and 3, and the hosts talk TCP; the ring is reordered by host. Every collective; every dtype
    # and op in the allreduce, float in the others (the in-process matrix runs every dtype of
    # every collective over two emulated hosts).
    for coll in allreduce reduce_scatter allgather broadcast reduce alltoall; do
      ops=sum dtypes=float limit=120
      # Every dtype x op: ~15 s alone, but 4 ranks over TCP on 2 cores wait for the scheduler at
      # every step while CI runs other tests and debootstrap beside it (2026-11-28: over 120 s,
      # rd's 4 KiB calls at 4-8 ms each). Still inside ctest's 300 s for the whole case.
      [ "$coll" = allreduce ] && ops=all dtypes=all limit=200
      out=$(timeout $limit "$ringrun" -n 4 -- sh -c 'RINGREDUCE_HOST_ID=h$((RINGREDUCE_RANK % 2)) exec "$@"' sh \
            "$perf" "$coll" -b 4 -e 4M -f 32 -n 2 -w 1 -d $dtypes -o $ops -r 3 2>&1)
      rc=$?
      if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
        echo "FAILED: $coll (rc $rc)"; echo "$out" | tail -30; exit 1
      fi
      echo "ok: $coll over two emulated hosts ($(grep -c '^\[0\]  ' <<<"$out") rows)"
    done
    ;;
  calibrate)
    # ringreduce-perf --calibrate writes the measured costs for N=2 and N=4 into one file (the
    # second run keeps the first one's line); a run with RINGREDUCE_TUNING_FILE takes them from
    # it instead of measuring, and a forced small-message algorithm still gives right results.
    file=$(mktemp /tmp/rr_calib_XXXXXX)
    trap 'cleanup; rm -f "$file"' EXIT
    for n in 2 4; do
      timeout 60 "$ringrun" -n "$n" -- "$perf" --calibrate "$file" || { echo "FAILED: calibrate N=$n"; exit 1; }
    done
    cat "$file"
    for n in 2 4; do
      grep -Eq "^link shm $n [0-9.e+-]+ [0-9.e+-]+ [0-9.e+-]+$" "$file" || { echo "FAILED: no line for N=$n"; exit 1; }
    done
    [ "$(grep -c '^gamma ' "$file")" = 1 ] || { echo "FAILED: not one gamma line"; exit 1; }
    out=$(RINGREDUCE_TUNING_FILE=$file RINGREDUCE_DEBUG=INFO timeout 60 "$ringrun" -n 4 -- "$perf" allreduce -b 4 -e 64K -f 16 -n 3 -w 1 2>&1)
    grep -q "from RINGREDUCE_TUNING_FILE" <<<"$out" || { echo "FAILED: file not used"; echo "$out" | tail; exit 1; }
    grep -q "Out of bounds values : 0 OK" <<<"$out" || { echo "FAILED: wrong results"; echo "$out" | tail; exit 1; }
    echo "ok: calibrated, and used"
    ;;
  startup)
    # Start-up faults across processes (rendezvous/join.h): each ends on every rank within a few
    # seconds (RINGREDUCE_TIMEOUT is 30 s), naming the rank at fault.
    perf1=("$perf" allreduce -b 4 -e 4 -n 1 -w 0)
    # run_rank NAME VARS...: one rank in the background, its output in $tmp/NAME.
    tmp=$(mktemp -d)
    trap 'cleanup; rm -rf "$tmp"' EXIT
    run_rank() {
      local name=$1
      shift
      env RINGREDUCE_TIMEOUT=30 "$@" timeout 60 "${perf1[@]}" >"$tmp/$name" 2>&1 &
      pids+=($!)
    }
    # expect NAME TEXT: the rank's output says TEXT.
    expect() { grep -qF -- "$2" "$tmp/$1" || { echo "FAILED: $1 does not say: $2"; cat "$tmp/$1"; exit 1; }; }
    elapsed() { echo $((SECONDS - $1)); }

    # pair WHAT FIRST SECOND FIRST_SAYS SECOND_SAYS FIRST_VARS -- SECOND_VARS: two ranks of a
    # world of 2 (RANK as given in the VARS), the second started 0.5 s after the first; each
    # must say its text within 10 s.
    pair() {
      local what=$1 first=$2 second=$3 first_says=$4 second_says=$5 t0=$SECONDS
      shift 5
      local vars=(RINGREDUCE_WORLD_SIZE=2 RINGREDUCE_ADDR=127.0.0.1:$(free_port)) one=()
      while [ "$1" != -- ]; do one+=("$1"); shift; done
      shift
      run_rank "$first" "${vars[@]}" "${one[@]}"
      sleep 0.5
      run_rank "$second" "${vars[@]}" "$@"
      wait "${pids[@]}"
      pids=()
      expect "$first" "$first_says"
      expect "$second" "$second_says"
      [ "$(elapsed $t0)" -lt 10 ] || { echo "FAILED: $what took $(elapsed $t0) s"; exit 1; }
      echo "ok: $what, both ranks told in $(elapsed $t0) s"
    }

    # 1. A rank started with RINGREDUCE_RANK=2 in a world of 2: it names itself, and rank 0
    #    learns it through the store instead of waiting for a rank 1.
    pair "a rank out of range" zero two \
      "rank 0: start-up: rank 2 failed: RINGREDUCE_RANK=2 is not below" \
      "rank 2: start-up: RINGREDUCE_RANK=2 is not below RINGREDUCE_WORLD_SIZE=2" \
      RINGREDUCE_RANK=0 -- RINGREDUCE_RANK=2
    # 2. A setting that does not parse on rank 1: named as rank 1 (its launcher's variable).
    pair "a bad setting on rank 1" zero one \
      "rank 0: start-up: rank 1 failed: RINGREDUCE_CHANNELS=0 is not in 1..64" \
      "rank 1: start-up: RINGREDUCE_CHANNELS=0 is not in 1..64" \
      RINGREDUCE_RANK=0 -- RINGREDUCE_RANK=1 RINGREDUCE_CHANNELS=0
    # 3. Rank 0, which hosts the store, fails before hosting it: it hosts it for the news, and
    #    rank 1 (waiting to reach the store) learns why instead of timing out.
    pair "the store's host failing first" one zero \
      "rank 1: start-up: rank 0 failed: RINGREDUCE_NSOCKS=99 is not in 1..16" \
      "rank 0: start-up: RINGREDUCE_NSOCKS=99 is not in 1..16" \
      RINGREDUCE_RANK=1 -- RINGREDUCE_RANK=0 RINGREDUCE_NSOCKS=99

    # 4. Two jobs, one after the other, on one standalone store: the second is refused at once
    #    without a job id of its own, and runs with one.
    port=$(free_port)
    timeout 120 "$build/tools/ringreduce-store" --host 127.0.0.1 --port "$port" >"$tmp/store" 2>&1 &
    pids+=($!)
    store_pid=$!
    job() {
      local tag=$1
      shift
      local ranks=()
      for r in 0 1; do
        env RINGREDUCE_TIMEOUT=30 RINGREDUCE_RANK=$r RINGREDUCE_WORLD_SIZE=2 RINGREDUCE_STORE_SERVER=0 \
          RINGREDUCE_ADDR=127.0.0.1:$port "$@" timeout 60 "${perf1[@]}" >"$tmp/$tag$r" 2>&1 &
        ranks+=($!)
      done
      local rc=0
      for p in "${ranks[@]}"; do wait "$p" || rc=1; done
      return $rc
    }
    job first || { echo "FAILED: the first job on the store"; cat "$tmp/first0" "$tmp/first1"; exit 1; }
    t0=$SECONDS
    if job second; then echo "FAILED: a second job ran on the first one's keys"; exit 1; fi
    expect second0 "RINGREDUCE_JOB_ID"
    expect second1 "RINGREDUCE_JOB_ID"
    [ "$(elapsed $t0)" -lt 10 ] || { echo "FAILED: the reused store took $(elapsed $t0) s"; exit 1; }
    job third RINGREDUCE_JOB_ID=third || { echo "FAILED: a job with its own id"; cat "$tmp/third0"; exit 1; }
    kill "$store_pid" 2>/dev/null
    echo "ok: a reused store: refused without a job id in $(elapsed $t0) s, runs with one"

    # 5. The open-file limit: 24 ranks hold ~70 descriptors each for their same-host peers. A
    #    soft limit of 80 is raised (the hard one allows it); a hard limit of 100 cannot hold
    #    them (4 per peer is the bound, and 32 of the library's own), and every rank says so at
    #    once. (ringrun itself needs 3 per rank and raises its own.)
    out=$( (ulimit -Sn 80 && RINGREDUCE_TIMEOUT=30 timeout 60 "$ringrun" -n 24 -- "${perf1[@]}") 2>&1) ||
      { echo "FAILED: 24 ranks under a soft limit of 80 open files"; echo "$out"; exit 1; }
    echo "ok: 24 ranks under a soft limit of 80 open files"
    # 24 ranks started by hand (ringrun would stop the others at the first failure).
    t0=$SECONDS
    (
      ulimit -n 100
      vars=(RINGREDUCE_TIMEOUT=30 RINGREDUCE_WORLD_SIZE=24 RINGREDUCE_ADDR=127.0.0.1:$(free_port))
      for r in $(seq 0 23); do
        env "${vars[@]}" RINGREDUCE_RANK=$r timeout 60 "${perf1[@]}" >"$tmp/limit$r" 2>&1 &
      done
      wait
    )
    # Each names itself, and the limit: its own, or (if another's failure mark came first) that
    # rank's, which is the same.
    for r in $(seq 0 23); do
      expect "limit$r" "rank $r: start-up: "
      expect "limit$r" "its links need about 124 open files (23 peers over shm) beside the "
      expect "limit$r" "it has open, but its limit is 100 and the hard limit 100"
    done
    [ "$(elapsed $t0)" -lt 10 ] || { echo "FAILED: the open-file limit took $(elapsed $t0) s"; exit 1; }
    echo "ok: a hard limit of 100 open files named by all 24 ranks in $(elapsed $t0) s"
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
    # RINGREDUCE_SHM=0: this case also keeps ringreduce's own TCP path covered across processes.
    out=$(timeout 120 mpirun --allow-run-as-root --oversubscribe -np 3 --mca btl self,tcp \
          -x RINGREDUCE_ADDR="127.0.0.1:$port" -x RINGREDUCE_SHM=0 "$perf" allreduce -b 4 -e 1M -f 32 -n 3 -w 1 2>&1)
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
  kill-shm|kill-tcp|kill-mix|stop-shm|stop-tcp|stop-mix)
    # Rank 2 of 4 SIGKILLs or SIGSTOPs itself in the middle of a collective, for each in turn,
    # and of a ring of sends and receives (fault_rank.cc). Killed: every survivor raises a PeerError naming rank 2 within 2 s. Stopped:
    # every survivor raises a TimeoutError naming the rank it waited on, the op and its number,
    # within the timeout (2 s) + 1 s, and with RINGREDUCE_STALL_WARN=1 the stall report names rank
    # 2. Either way each survivor destroys its communicator, has as many descriptors and threads
    # as before it, and exits 0; /dev/shm is unchanged. Ranks are started by hand (ringrun would
    # stop the job as soon as one rank dies); mix: two emulated hosts (ranks 0 and 2 on one), so
    # rank 0 sees the fault over shared memory and ranks 1 and 3 over TCP.
    mode=${case_name%-*}
    kind=${case_name#*-}
    shm=1; [ "$kind" = tcp ] && shm=0
    before=$(ls /dev/shm 2>/dev/null | sort)
    rc=0
    # Every collective over shared memory; over TCP and mixed hosts, where what differs is how
    # the fault reaches the survivors (a closed socket, a timeout on a TCP link) rather than the
    # algorithm, a ring allreduce, a rooted chain (broadcast) and sends and receives: each
    # collective is 2-3 s of this test.
    colls="allreduce reduce_scatter allgather broadcast reduce alltoall barrier p2p"
    [ "$kind" = shm ] || colls="allreduce broadcast p2p"
    for coll in $colls; do
      port=$(free_port)
      pids=()
      for r in 0 1 2 3; do
        host=one; [ "$kind" = mix ] && host=h$((r % 2))
        env RINGREDUCE_RANK=$r RINGREDUCE_WORLD_SIZE=4 RINGREDUCE_ADDR=127.0.0.1:$port RINGREDUCE_SHM=$shm \
          RINGREDUCE_HOST_ID=$host RINGREDUCE_STALL_WARN=1 \
          timeout 60 "$build/tests/multiprocess/fault_rank" "$mode" 2 "$coll" 2 >"/tmp/rr_fault_$$_$r.log" 2>&1 &
        pids+=($!)
      done
      for i in 0 1 3; do
        wait "${pids[$i]}"; code=$?
        grep -E "^(RESULT|CLEAN)" "/tmp/rr_fault_$$_$i.log" | sed "s/^/$mode $kind $coll: /"
        if [ $code -ne 0 ]; then echo "FAILED: $coll: rank $i exited $code"; cat "/tmp/rr_fault_$$_$i.log"; rc=1; fi
      done
      if [ "$mode" = stop ]; then
        # The stopped victim never resumes: kill it by pid. Some survivor must have named it in
        # a stall report (it never said it reached the stuck op); sends and receives have no
        # sequence to report, their timeouts name the peer.
        kill -9 "${pids[2]}" 2>/dev/null; wait "${pids[2]}" 2>/dev/null
        if [ "$coll" != p2p ] && ! cat /tmp/rr_fault_$$_[013].log | grep "WARN stall: $coll #" | grep -q "rank 2"; then
          echo "FAILED: $coll: no stall report named rank 2"; cat /tmp/rr_fault_$$_[013].log; rc=1
        fi
      else
        wait "${pids[2]}"; code=$?
        [ $code -eq 137 ] || { echo "FAILED: $coll: the victim exited $code, not by SIGKILL"; rc=1; }
      fi
      rm -f /tmp/rr_fault_$$_*.log
    done
    after=$(ls /dev/shm 2>/dev/null | sort)
    [ "$before" = "$after" ] || { echo "FAILED: /dev/shm changed: $(comm -13 <(echo "$before") <(echo "$after"))"; rc=1; }
    exit $rc
    ;;
  shrink-shm|shrink-tcp|shrink-mix)
    # Ranks SIGKILLed at different points (shrink_rank.cc): inside an allreduce, between calls,
    # inside a ring of sends and receives, rank 0 (which hosts the store), two at once, and one
    # more while the survivors shrink (inside the agreement or while the links are made). Every
    # survivor shrinks, goes on with exactly the ranks that were not killed, checks a collective
    # on them is exact, and leaves as many descriptors and threads as it had; /dev/shm is
    # unchanged. Ranks are started by hand (ringrun stops a job when a rank dies, unless
    # --elastic). mix: two emulated hosts by rank parity.
    kind=${case_name#*-}
    shm=1; [ "$kind" = tcp ] && shm=0
    before=$(ls /dev/shm 2>/dev/null | sort)
    rc=0
    case $kind in
      shm) runs=${RR_SHRINK_RUNS:-"8:coll:5 4:coll:2 4:between:1 4:p2p:3 4:coll:0 4:coll:1,2 8:shrink:2,5"} ;;
      tcp) runs=${RR_SHRINK_RUNS:-"4:coll:2 4:coll:0 4:shrink:1,3"} ;;
      mix) runs=${RR_SHRINK_RUNS:-"4:coll:2 4:p2p:1 6:shrink:3,4"} ;;
    esac
    for run in $runs; do
      IFS=: read -r n when victims <<<"$run"
      nv=$(tr ',' '\n' <<<"$victims" | wc -l)
      expected=$((n - nv))
      port=$(free_port)
      pids=()
      for ((r = 0; r < n; r++)); do
        host=one; [ "$kind" = mix ] && host=h$((r % 2))
        env RINGREDUCE_RANK=$r RINGREDUCE_WORLD_SIZE=$n RINGREDUCE_ADDR=127.0.0.1:$port RINGREDUCE_SHM=$shm \
          RINGREDUCE_HOST_ID=$host timeout 60 "$build/tests/multiprocess/shrink_rank" "$when" "$victims" "$expected" 10 \
          >"/tmp/rr_shrink_$$_$r.log" 2>&1 &
        pids+=($!)
      done
      worst=0
      for ((r = 0; r < n; r++)); do
        wait "${pids[$r]}"; code=$?
        if [[ ",$victims," == *",$r,"* ]]; then
          [ $code -eq 137 ] || { echo "FAILED: $run: victim $r exited $code, not by SIGKILL"; cat "/tmp/rr_shrink_$$_$r.log"; rc=1; }
          continue
        fi
        grep -E "^(RESULT|CLEAN|SHRINK)" "/tmp/rr_shrink_$$_$r.log" | sed "s/^/$kind n=$n $when kill $victims: /"
        if [ $code -ne 0 ]; then echo "FAILED: $run: rank $r exited $code"; cat "/tmp/rr_shrink_$$_$r.log"; rc=1; fi
      done
      rm -f /tmp/rr_shrink_$$_*.log
    done
    after=$(ls /dev/shm 2>/dev/null | sort)
    [ "$before" = "$after" ] || { echo "FAILED: /dev/shm changed: $(comm -13 <(echo "$before") <(echo "$after"))"; rc=1; }
    exit $rc
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
