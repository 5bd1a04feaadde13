#!/usr/bin/env bash
# Launch tests on an emulated cluster (scripts/cluster): each case brings up its own namespaces
# under its own name, runs real launches of ringreduce-perf across them, and takes them down from
# an EXIT trap, pass or fail. Traffic stays inside the namespaces.
#   ipv4      3 hosts x 2 ranks (shared memory inside a host, TCP between): every collective
#             and dtype, every op in the allreduce; interface selection (auto past a docker0 bridge, =eth0, an exclusion
#             that leaves only loopback);
#             the star allreduce forced
#   ipv6      2 hosts with IPv6 addresses only: allreduce and allgather, every dtype
#   mpirun    OpenMPI's mpirun over 2 hosts x 2 slots (its rsh agent enters the namespaces)
#   slurm     Slurm's variables, set by hand as srun would, 2 hosts x 2 ranks
#   srun      Debian's Slurm on 4 hosts (scripts/cluster up --slurm): srun of 4 x 2 ranks,
#             docs/CLUSTER.md's batch script, verbatim, under sbatch --wait, torch DDP under srun,
#             a program built against the installed package under srun, a rank SIGKILLed in
#             the middle of an srun job (the others name it, srun ends), and a whole node dying
#             (slurmd, slurmstepd and its ranks: the others name one of its ranks, srun ends on
#             Slurm's node failure)
#   torchrun  torchrun's variables, 3 hosts x 1 rank
#   torchrun-elastic  torchrun's c10d rendezvous (--nnodes 1:3) over 3 hosts with the torch
#             backend: a host leaves (SIGKILL) and joins again, the group goes on each time
#   linkdown  3 hosts x 1 rank looping over 64 MiB allreduces (RINGREDUCE_TIMEOUT=5): host 2's
#             link is taken down in the middle (scripts/cluster link 2 down); every rank must fail
#             within the timeout + 1 s of the cut, ranks 0 and 1 naming rank 2 and rank 2 naming
#             rank 0 or 1, and leave no descriptor or thread behind
#   shrink    4 hosts x 1 rank at 1 Gbit/s, then 3 hosts x 2 ranks (shared memory within, TCP
#             between): a rank SIGKILLed inside an allreduce (shrink_rank.cc); the survivors shrink
#             and go on exactly, from the kill to the first exact allreduce in under 2 s, and
#             leave no descriptor or thread behind
#   mitm      3 hosts, RINGREDUCE_ENCRYPT=psk, then =tls (certificates made for the run): relays
#             in hosts 1 and 2's namespaces (mitm_relay.py, their connections to each other sent
#             through them by nftables) flip a bit of, replay, drop or reorder one record host 1
#             sends to host 2; every rank names it, no wrong value is delivered
#   loss      3 hosts, 5% of the frames dropped each way on host 2's link (scripts/cluster loss):
#             allreduces of every dtype and several sizes must come out right, with the drops
#             counted and TCP seen retransmitting
# Usage: cluster.sh CASE BUILD_DIR. Exit 77 = skipped (not root, or no network namespaces).
set -uo pipefail
case_name=$1
build=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../scripts/cluster
perf=$build/tools/ringreduce-perf
# One cluster name per case, so that cases can run side by side.
# (torchrun and torchrun-elastic share their first four letters: the length tells them apart.)
export CLUSTER_NAME=rrt${case_name:0:4}${#case_name}
# A message that never arrives must fail its op, naming the ranks, well inside each launch's own
# timeout (60-120 s), rather than run into it silently (the default waits 300 s).
export RINGREDUCE_TIMEOUT=${RINGREDUCE_TIMEOUT:-45}

[ "$(id -u)" = 0 ] || { echo "skipped: the emulated cluster needs root (network namespaces, tc)"; exit 77; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "skipped: needs iproute2 (ip, tc)"; exit 77; }
# What the cluster needs from the kernel: namespaces, veth pairs, a bridge, tbf.
probe=rrtprobe$$
ip netns add "$probe" 2>/dev/null || { echo "skipped: cannot create network namespaces here"; exit 77; }
why=""
ip -n "$probe" link add pa type veth peer name pb 2>/dev/null || why="no veth"
[ -z "$why" ] && { ip -n "$probe" link add br0 type bridge 2>/dev/null || why="no bridge"; }
[ -z "$why" ] && { ip netns exec "$probe" tc qdisc add dev pa root tbf rate 1gbit burst 65536 latency 100ms \
  2>/dev/null || why="no tbf qdisc"; }
ip netns del "$probe"
[ -z "$why" ] || { echo "skipped: this kernel cannot emulate the cluster ($why)"; exit 77; }

work=$(mktemp -d)
runner=""  # a launch running in the background, stopped (with its ranks) on the way out
relays=""  # the mitm case's relays while they run, stopped on the way out
cleanup() {
  if [ -n "$runner" ] && kill -0 "$runner" 2>/dev/null; then
    kill -TERM "$runner"
    wait "$runner" 2>/dev/null
  fi
  if [ -n "$relays" ]; then
    # shellcheck disable=SC2086
    kill $relays 2>/dev/null
    # shellcheck disable=SC2086
    wait $relays 2>/dev/null
  fi
  "$cluster" down
  [ -n "${RR_CHROOT:-}" ] && rmdir "$RR_CHROOT$work" 2>/dev/null  # the torchrun-elastic bind's mount point
  rm -rf "$work"
  if ip netns list | grep -q "^${CLUSTER_NAME}"; then echo "FAILED: namespaces left behind"; exit 1; fi
}
trap cleanup EXIT

fail() { echo "FAILED: $*"; exit 1; }
# Runs one launch; the output must show every value right and the given world size.
check_run() {
  local what=$1 ranks=$2
  shift 2
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out" || ! grep -q "$ranks ranks" <<<"$out"; then
    # The launcher's own lines (which ranks still ran on a timeout, and where) in full.
    grep -v '^cluster:' <<<"$out" | tail -40
    grep '^cluster:' <<<"$out" | head -300
    fail "$what (rc $rc)"
  fi
  # Rows of rank 0's table: "[0]"-prefixed by scripts/cluster run, bare under srun.
  echo "ok: $what ($(grep -cE '^(\[0\] )? {3,}[0-9]' <<<"$out") rows)"
}

case "$case_name" in
  ipv4)
    "$cluster" up 3 --rate 10gbit || fail "cluster up"
    # Every host also has a docker bridge with the same address, listed before eth0: the automatic
    # choice must skip it (a rank that advertised it would be dialled at another host's bridge).
    for i in 0 1 2; do
      ip -n "${CLUSTER_NAME}h$i" link add docker0 type bridge &&
        ip -n "${CLUSTER_NAME}h$i" addr add 172.17.0.1/16 dev docker0 &&
        ip -n "${CLUSTER_NAME}h$i" link set docker0 up || fail "docker0 on host $i"
    done
    # Every dtype x op crosses the hosts once, in the allreduce; the other collectives move the same
    # elements with the same kernels, so they run every dtype with sum (the in-process matrix runs
    # every collective x dtype x op over emulated hosts).
    for coll in allreduce reduce_scatter allgather broadcast reduce alltoall; do
      ops=sum
      [ "$coll" = allreduce ] && ops=all
      check_run "$coll, 3 hosts x 2 ranks" 6 "$cluster" run --ranks-per-host 2 --timeout 120 -- \
        "$perf" "$coll" -b 4 -e 1M -f 32 -n 2 -w 1 -d all -o $ops -r 5
    done
    check_run "allreduce, RINGREDUCE_SOCKET_IFNAME==eth0" 3 "$cluster" run --timeout 60 \
      --env RINGREDUCE_SOCKET_IFNAME==eth0 -- "$perf" allreduce -b 4 -e 1M -f 32 -n 2 -w 1
    check_run "allreduce, star forced" 3 "$cluster" run --timeout 60 --env RINGREDUCE_ALGO=allreduce:star -- \
      "$perf" allreduce -b 4 -e 4M -f 64 -n 2 -w 1 -d all -o all
    # Excluding every interface but loopback: each rank must say so, not hang.
    out=$("$cluster" run --timeout 60 --env RINGREDUCE_SOCKET_IFNAME=^eth -- "$perf" allreduce -b 4 -e 4 -n 1 -w 0 2>&1)
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "an interface filter that leaves only loopback across hosts must fail at once (rc $rc)"; }
    echo "$out" | grep -m1 "loopback.*on another host" || { echo "$out"; fail "no clear error for the excluded interfaces"; }
    echo "ok: RINGREDUCE_SOCKET_IFNAME=^eth fails clearly (rc $rc)"
    ;;
  ipv6)
    "$cluster" up 2 --rate 10gbit --ipv6-only || fail "cluster up"
    ip -n "${CLUSTER_NAME}h0" -4 addr show dev eth0 | grep -q inet && fail "host 0 has an IPv4 address"
    for coll in allreduce allgather; do
      check_run "$coll over IPv6 only, 2 hosts x 2 ranks" 4 "$cluster" run --ranks-per-host 2 --timeout 120 -- \
        "$perf" "$coll" -b 4 -e 1M -f 32 -n 2 -w 1 -d all
    done
    ;;
  mpirun)
    command -v mpirun >/dev/null || { echo "skipped: mpirun (OpenMPI) not installed"; exit 77; }
    "$cluster" up 2 --rate 10gbit || fail "cluster up"
    # mpirun runs on host 0 and starts its daemons on the other hosts through an "rsh agent" that
    # enters the host's namespace, as ssh would enter the host.
    "$cluster" hostfile 2 >"$work/hosts"
    check_run "allreduce under mpirun, 2 hosts x 2 slots" 4 timeout 120 ip netns exec "${CLUSTER_NAME}h0" \
      mpirun --allow-run-as-root -np 4 --hostfile "$work/hosts" --mca plm_rsh_agent "$cluster agent" \
      --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 -x RINGREDUCE_ADDR=10.213.77.1:29500 \
      "$perf" allreduce -b 4 -e 4M -f 32 -n 2 -w 1 -d all
    ;;
  slurm)
    "$cluster" up 2 --rate 10gbit || fail "cluster up"
    check_run "reduce with Slurm's variables, 2 hosts x 2 ranks" 4 "$cluster" run --launcher slurm \
      --ranks-per-host 2 --timeout 120 -- "$perf" reduce -b 4 -e 1M -f 32 -n 2 -w 1 -r 3 -d all
    ;;
  srun)
    # Debian's Slurm itself (scripts/cluster up --slurm): srun across 4 hosts x 2 ranks, and
    # docs/CLUSTER.md's batch script, verbatim, under sbatch --wait.
    for c in slurmctld slurmd srun munged; do
      command -v "$c" >/dev/null || { echo "skipped: needs Debian's slurmctld, slurmd, slurm-client, munge ($c)"; exit 77; }
    done
    "$cluster" up 4 --rate 10gbit --slurm || fail "cluster up --slurm"
    check_run "srun -N 4 --ntasks-per-node 2" 8 timeout 120 "$cluster" exec 0 -- srun -N 4 \
      --ntasks-per-node 2 env RINGREDUCE_ADDR=10.213.77.1:29500 "$perf" allreduce -b 4 -e 1M \
      -f 32 -n 2 -w 1 -d all
    sed -n '/<!-- sbatch-script -->/,/<!-- \/sbatch-script -->/p' "$here/../../docs/CLUSTER.md" |
      sed '1d;$d;s/^    //' >"$work/job.sh"
    grep -q '^srun ./train$' "$work/job.sh" || fail "no batch script in docs/CLUSTER.md"
    printf '#!/bin/sh\nexec %s allreduce -b 4 -e 1M -f 32 -n 2 -w 1\n' "$perf" >"$work/train"
    chmod +x "$work/train"
    (cd "$work" && timeout 120 "$cluster" exec 0 -- sbatch --wait -o "$work/sbatch.out" job.sh) ||
      { cat "$work/sbatch.out"; fail "sbatch of docs/CLUSTER.md's script"; }
    out=$(sed 's/^/[0] /' "$work/sbatch.out")
    grep -q "Out of bounds values : 0 OK" "$work/sbatch.out" && grep -q "8 ranks" "$work/sbatch.out" ||
      { cat "$work/sbatch.out"; fail "sbatch: the job's output"; }
    echo "ok: docs/CLUSTER.md's batch script under sbatch, 4 nodes x 2 tasks"
    # A user's program built against the installed package (find_package(ringreduce CONFIG), as
    # tests/package/check.sh builds it), 4 nodes x 2 tasks: Communicator::from_env() reads
    # Slurm's variables itself.
    timeout 120 cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
      { cat "$work/install.log"; fail "cmake --install"; }
    timeout 120 cmake -S "$here/../package/consumer" -B "$work/consumer" -G Ninja \
      -DCMAKE_PREFIX_PATH="$work/prefix" >>"$work/install.log" 2>&1 &&
      timeout 300 cmake --build "$work/consumer" --target consumer >>"$work/install.log" 2>&1 ||
      { cat "$work/install.log"; fail "building the consumer against the installed package"; }
    timeout 120 "$cluster" exec 0 -- srun -N 4 --ntasks-per-node 2 env -u LD_LIBRARY_PATH \
      RINGREDUCE_ADDR=10.213.77.1:29500 "$work/consumer/consumer" >"$work/consumer.out" 2>&1 ||
      { cat "$work/consumer.out"; fail "the installed package's consumer under srun"; }
    [ "$(grep -c "^consumer ok: rank [0-7] of 8," "$work/consumer.out")" = 8 ] ||
      { cat "$work/consumer.out"; fail "the consumer under srun: not 8 ranks ok"; }
    echo "ok: a program built against the installed package, under srun, 4 nodes x 2 tasks"
    # torch DDP under srun (backend ringreduce), torch.distributed's variables from Slurm's as a
    # batch script sets them.
    if /usr/bin/python3 -c 'import torch, sklearn' 2>/dev/null && [ -d "$build/python/ringreduce/torch" ]; then
      timeout 180 "$cluster" exec 0 -- srun -N 4 --ntasks-per-node 1 sh -c \
        'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=10.213.77.1 MASTER_PORT=29513
         export RINGREDUCE_SOCKET_IFNAME=eth0 PYTHONPATH="$0/python"
         exec /usr/bin/python3 "$1" --quiet --epochs 2' "$build" "$here/../../examples/train_ddp.py" \
        >"$work/ddp.out" 2>&1 || { cat "$work/ddp.out"; fail "DDP under srun"; }
      grep -q "^final: backend=ringreduce ranks=4 " "$work/ddp.out" || { cat "$work/ddp.out"; fail "DDP under srun: no final line"; }
      echo "ok: DDP under srun, 4 nodes: $(grep '^final:' "$work/ddp.out")"
    else
      echo "note: DDP under srun not run (no torch, scikit-learn or torch backend here)"
    fi
    # A rank SIGKILLed in the middle of a job: the others fail at once naming it, and srun ends.
    # Each task's output to a file of its own (%t: its rank): srun's merged stream once lost a
    # survivor's lines when srun ended the step ("Force Terminated") before forwarding them.
    rm -f "$work"/killed.*.out
    timeout 120 "$cluster" exec 0 -- srun -N 4 --ntasks-per-node 1 --kill-on-bad-exit=0 \
      --output="$work/killed.%t.out" \
      env RINGREDUCE_ADDR=10.213.77.1:29500 RINGREDUCE_TIMEOUT=30 "$perf" allreduce \
      -b 16M -e 16M -n 1000 -w 1 -c 0 >"$work/killed.out" 2>&1 &
    runner=$!
    victim=""
    for _ in $(seq 1 300); do  # bounded: 30 s for rank 2 to start its loop
      for p in $(pgrep -f "ringreduce-perf allreduce -b 16M"); do
        tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx SLURM_PROCID=2 && victim=$p
      done
      [ -n "$victim" ] && break
      sleep 0.1
    done
    [ -n "$victim" ] || fail "rank 2 of the srun job never started"
    sleep 2
    kill -KILL "$victim"
    cut=$(date +%s%N)
    wait "$runner"
    rc=$?
    runner=""
    took_ms=$((($(date +%s%N) - cut) / 1000000))
    [ "$rc" -ne 0 ] || fail "srun exited 0 after rank 2 was killed"
    for r in 0 1 3; do
      grep -q "rank $r.*rank 2\|rank 2.*rank $r" "$work/killed.$r.out" ||
        { tail -n 20 "$work"/killed*.out; fail "rank $r did not name rank 2"; }
    done
    [ "$took_ms" -lt 20000 ] || { tail -n 20 "$work"/killed*.out; fail "srun took ${took_ms} ms to end"; }
    cat "$work"/killed.[013].out | grep "rank 2" | head -4
    echo "ok: a rank SIGKILLed under srun: every other rank named it, srun ended ${took_ms} ms after (rc $rc)"
    # A node dies (every process of host 2: slurmd, slurmstepd, its 2 ranks): the ranks of the
    # other nodes fail at once naming a rank of it; srun ends when slurmctld declares the node
    # down (SlurmdTimeout=10 in scripts/cluster_slurm.sh: 25 s here), not before, as Slurm waits
    # for the node's tasks.
    timeout 120 "$cluster" exec 0 -- srun -N 4 --ntasks-per-node 2 env RINGREDUCE_ADDR=10.213.77.1:29500 \
      RINGREDUCE_TIMEOUT=30 "$perf" allreduce -b 16M -e 16M -n 1000 -w 1 -c 0 >"$work/node.out" 2>&1 &
    runner=$!
    for _ in $(seq 1 300); do  # bounded: 30 s for host 2's ranks to start
      [ "$(ip netns pids "${CLUSTER_NAME}h2" | xargs -r ps -o comm= -p | grep -c ringreduce-perf)" = 2 ] && break
      sleep 0.1
    done
    sleep 2
    ip netns pids "${CLUSTER_NAME}h2" | xargs -r kill -KILL
    cut=$(date +%s%N)
    wait "$runner"
    rc=$?
    runner=""
    took_ms=$((($(date +%s%N) - cut) / 1000000))
    [ "$rc" -ne 0 ] || fail "srun exited 0 after node 2 died"
    for r in 0 1 2 3 6 7; do
      grep -q "^ringreduce-perf: rank $r: .*rank [45]" "$work/node.out" ||
        { cat "$work/node.out"; fail "rank $r did not fail naming rank 4 or 5 (node 2's)"; }
    done
    grep -q "Node failure on ${CLUSTER_NAME}h2" "$work/node.out" || { cat "$work/node.out"; fail "srun did not report the node failure"; }
    [ "$took_ms" -lt 60000 ] || fail "srun took ${took_ms} ms to end after node 2 died"
    echo "ok: node 2 died under srun: ranks 0-3 and 6-7 named a rank of it, srun ended ${took_ms} ms after on Slurm's node failure"
    ;;
  torchrun-elastic)
    # torchrun's c10d rendezvous across 3 hosts (--nnodes 1:3), backend ringreduce on the
    # agents' store: host 2 leaves (its agent and worker SIGKILLed), the others go on as a group
    # of 2, host 2 joins again, the group of 3 goes on; every step's allreduce exact at its world
    # size, a fresh communicator per group. The agents run with their hosts' names (as on real
    # hosts: each tells its workers a host name, which must resolve).
    # With RR_CHROOT (scripts/torch2 sets it: its suite's root, this clone mounted at /src in it,
    # BUILD_DIR its build) the agents run in that root, with its Python and torch (2.6, 2.14);
    # else with the host's (1.13).
    # Every worker line in the agent's log (--tee), stderr too where the torchrun can (2.x: a
    # worker's error then shows; torch 1.13's torchrun on Python 3.11 fails with anything but
    # stdout alone, tests/python/test_torchrun.py says why).
    py=(/usr/bin/python3) src=$here/../.. pybuild=$build tee=(--redirects 1 --tee 1)
    if [ -n "${RR_CHROOT:-}" ]; then
      # Inside `cluster exec`'s own mount namespace: the host's name resolution (the namespace's
      # /etc/hosts) into the root, then the root; nothing of the host's environment leaks in.
      # The work folder (the finish flag) is bound at its own path in the root.
      # shellcheck disable=SC2016  # expanded by that shell
      py=(sh -c 'mkdir -p "$0$1" && mount --bind "$1" "$0$1" && mount --bind /etc/hosts "$0/etc/hosts" &&
            shift && exec chroot "$0" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
            LANG=C.UTF-8 USE_LIBUV=0 PYTHONUNBUFFERED=1 PYTHONPATH="$PYTHONPATH" RINGREDUCE_TIMEOUT="$RINGREDUCE_TIMEOUT" \
            RINGREDUCE_SOCKET_IFNAME="$RINGREDUCE_SOCKET_IFNAME" \
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="$TORCH_DISABLE_SHARE_RDZV_TCP_STORE" "$@"' \
          "$RR_CHROOT" "$work" /usr/bin/python3)
      src=/src pybuild=/src/$(basename "$build") tee=(--redirects 3 --tee 3)
      chroot "$RR_CHROOT" /usr/bin/python3 -c 'import torch' 2>/dev/null &&
        [ -d "$build/python/ringreduce/torch" ] ||
        { echo "skipped: needs torch and the ringreduce torch backend in $RR_CHROOT"; exit 77; }
    else
      /usr/bin/python3 -c 'import torch' 2>/dev/null && [ -d "$build/python/ringreduce/torch" ] ||
        { echo "skipped: needs torch and the ringreduce torch backend"; exit 77; }
    fi
    echo "torch $(chroot "${RR_CHROOT:-/}" /usr/bin/python3 -c 'import torch; print(torch.__version__)')"
    "$cluster" up 3 --rate 10gbit || fail "cluster up"
    agent() {  # agent HOST LOG: torchrun on host HOST, in the background
      # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch 2.x's agents otherwise share one store
      # across rounds, and an agent that joins a running job waits forever for a key of its
      # round that the rank-0 agent never writes (RendezvousStoreInfo, round 1 and later; gloo
      # alike). (1.13 has no such sharing.)
      "$cluster" exec "$1" --hostname -- env PYTHONPATH="$pybuild/python" RINGREDUCE_SOCKET_IFNAME=eth0 \
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 \
        RINGREDUCE_TIMEOUT=20 timeout 170 "${py[@]}" "$src/scripts/torchrun-nolibuv" \
        "${tee[@]}" --rdzv_backend c10d --rdzv_endpoint "${CLUSTER_NAME}h0:29400" \
        --rdzv_id elastic --rdzv_conf last_call_timeout=2 --nnodes 1:3 --nproc_per_node 1 \
        --max_restarts 10 --monitor_interval 0.5 "$src/tests/multiprocess/elastic_worker.py" \
        "$work/finish" >"$2" 2>&1 &
    }
    # wait_for PATTERN FILE: bounded, 90 s.
    wait_for() {
      for _ in $(seq 1 900); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done
      # Each agent's story: its rendezvous rounds, its workers' steps and errors (--tee).
      local f
      for f in "$work"/agent*.log; do
        echo "--- $(basename "$f")"
        grep -E "STEP|DONE|Error:|InvalidArgument|[Rr]endezvous.*(complete|round|closed)|[Rr]estart|Killed|max_restarts" "$f" |
          grep -vE "^\s*(File|raise|\^)" | uniq | tail -n 25 | cut -c1-300
      done
      # The whole logs, where the caller keeps them (scripts/torch2 does).
      [ -n "${RR_CLUSTER_LOGS:-}" ] && mkdir -p "$RR_CLUSTER_LOGS" && cp "$work"/agent*.log "$RR_CLUSTER_LOGS/"
      fail "never saw '$1' in $2"
    }
    agent 0 "$work/agent0.log"; a0=$!
    agent 1 "$work/agent1.log"; a1=$!
    agent 2 "$work/agent2.log"; a2=$!
    wait_for "STEP .* world=3 .*step=3 ok" "$work/agent0.log"
    echo "ok: a group of 3 hosts"
    for p in $(pgrep -f "torchrun-nolibuv|elastic_worker.py"); do
      [ "$(ip netns identify "$p" 2>/dev/null)" = "${CLUSTER_NAME}h2" ] && kill -KILL "$p"
    done
    wait "$a2" 2>/dev/null
    wait_for "STEP .* world=2 .*step=3 ok" "$work/agent0.log"
    echo "ok: host 2 left; a group of 2 went on"
    agent 2 "$work/agent2b.log"; a2=$!
    wait_for "STEP .* world=3 .*step=3 ok" "$work/agent2b.log"
    echo "ok: host 2 joined again; a group of 3 went on"
    touch "$work/finish"
    for p in $a0 $a1 $a2; do wait "$p" || fail "an agent exited $? (logs: agent*.log)"; done
    ! grep -h "WRONG" "$work"/agent*.log || fail "a wrong allreduce result"
    grep -q "DONE .* world=3" "$work/agent0.log" || fail "the last group did not end on host 0"
    echo "ok: torchrun's c10d rendezvous, a host leaving and joining: $(grep -c 'STEP' "$work/agent0.log") steps on host 0, every one exact"
    ;;
  torchrun)
    "$cluster" up 3 --rate 10gbit || fail "cluster up"
    check_run "broadcast with torchrun's variables, 3 hosts" 3 "$cluster" run --launcher torchrun \
      --timeout 120 -- "$perf" broadcast -b 4 -e 1M -f 32 -n 2 -w 1 -r 2 -d all
    ;;
  shrink)
    for shape in "4 1 2" "3 2 3"; do
      read -r hosts per victim <<<"$shape"
      n=$((hosts * per))
      "$cluster" up "$hosts" --rate 1gbit || fail "cluster up"
      pids=()
      for ((r = 0; r < n; r++)); do
        h=$((r / per))
        "$cluster" exec "$h" -- env RINGREDUCE_RANK=$r RINGREDUCE_WORLD_SIZE=$n \
          RINGREDUCE_ADDR=10.213.77.1:29500 RINGREDUCE_LOCAL_SIZE=$per \
          timeout 60 "$build/tests/multiprocess/shrink_rank" coll "$victim" $((n - 1)) 10 \
          >"$work/shrink_$r" 2>&1 &
        pids+=($!)
      done
      for ((r = 0; r < n; r++)); do
        wait "${pids[$r]}"
        code=$?
        if [ "$r" = "$victim" ]; then
          [ $code -eq 137 ] || { cat "$work/shrink_$r"; fail "victim $r exited $code, not by SIGKILL"; }
          continue
        fi
        grep -E "^(RESULT|CLEAN)" "$work/shrink_$r" | sed "s/^/$hosts hosts x $per: /"
        [ $code -eq 0 ] || { cat "$work/shrink_$r"; fail "rank $r exited $code"; }
        took=$(sed -n 's/.*recovered after \([0-9.]*\) s.*/\1/p' "$work/shrink_$r")
        awk -v t="$took" 'BEGIN { exit !(t > 0 && t < 2.0) }' ||
          fail "rank $r: ${took} s from the kill to its first exact allreduce after the shrink"
      done
      "$cluster" down
    done
    echo "ok: survivors of a SIGKILL across hosts shrink and go on exactly within 2 s"
    ;;
  linkdown)
    "$cluster" up 3 --rate 1gbit || fail "cluster up"
    mkdir "$work/ready"
    # Each rank marks $work/ready once its first allreduce is done: the cut comes in the loop.
    "$cluster" run --timeout 60 --env RINGREDUCE_TIMEOUT=5 -- \
      "$build/tests/multiprocess/netfault_rank" 64 40 "$work/ready" >"$work/out" 2>&1 &
    runner=$!
    for _ in $(seq 1 300); do
      [ "$(ls "$work/ready" | wc -l)" -ge 3 ] || ! kill -0 "$runner" 2>/dev/null && break
      sleep 0.1
    done
    [ "$(ls "$work/ready" | wc -l)" -ge 3 ] || { cat "$work/out"; fail "the ranks never got into their loop"; }
    sleep 0.5
    cut=$(date +%s.%N)
    "$cluster" link 2 down || fail "link 2 down"
    wait "$runner"
    rc=$?
    runner=""
    grep -E "RESULT|CLEAN|WRONG" "$work/out"
    [ $rc -eq 0 ] || { cat "$work/out"; fail "a rank did not fail, or failed wrongly (rc $rc)"; }
    for r in 0 1 2; do
      line=$(grep -m1 "^\[$r\] RESULT rank $r " "$work/out") || fail "no result from rank $r"
      read -r type peer at < <(awk '{print $5, $7, $9}' <<<"$line" | tr -d :)
      took=$(awk -v a="$at" -v c="$cut" 'BEGIN { printf "%.3f", a - c }')
      # The rank it names: a PeerError's peer, else the last "waiting for rank N" (a notice from
      # a neighbour quotes that neighbour's own error).
      named=$peer
      [ "$type" = PeerError ] || named=$(grep -o "waiting for rank [0-9]*" <<<"$line" | tail -1 | awk '{print $4}')
      echo "rank $r: $type after ${took} s, naming rank ${named:-none}"
      case "$type" in TimeoutError | PeerError) ;; *) fail "rank $r raised $type" ;; esac
      awk -v t="$took" 'BEGIN { exit !(t >= 0 && t <= 6.0) }' ||
        fail "rank $r failed ${took} s after the cut, not within the timeout (5 s) + 1 s"
      if [ $r = 2 ]; then
        [ "$named" = 0 ] || [ "$named" = 1 ] || fail "rank 2, cut off, must name a rank it waited on (0 or 1)"
      else
        [ "$named" = 2 ] || fail "rank $r must name rank 2, the unreachable one"
      fi
      grep -q "^\[$r\] CLEAN rank $r fds \([0-9]*\) -> \1 threads \([0-9]*\) -> \2 " "$work/out" ||
        fail "rank $r left descriptors or threads behind"
    done
    echo "ok: a link down in the middle of allreduces fails every rank naming the right one in time"
    ;;
  loss)
    command -v nft >/dev/null || { echo "skipped: needs nftables (nft)"; exit 77; }
    # What scripts/cluster loss needs from the kernel: nftables on bridged frames, numgen.
    ip netns add "$probe" || fail "ip netns add"
    printf '%s\n' "table bridge t { chain c { type filter hook forward priority 0; numgen random mod 100 < 5 drop; }; }" |
      ip netns exec "$probe" nft -f - 2>/dev/null
    ok=$?
    ip netns del "$probe"
    [ $ok = 0 ] || { echo "skipped: this kernel cannot drop bridged frames with nftables (bridge family, numgen)"; exit 77; }
    "$cluster" up 3 --rate 1gbit || fail "cluster up"
    "$cluster" loss 2 5 || fail "cluster loss 2 5"
    # Recursive doubling (4 B, 512 B) and the ring (64 KiB), then
    # float at 256 KiB and 1 MiB (hundreds of frames per link each way). Loss costs TCP
    # retransmission timeouts (200 ms at least; a 1 MiB allreduce takes seconds), which is why
    # this is small; every dtype was 36 of these calls and 40 s of the test, and what loss tests
    # is the transport, the same for every dtype (the dtypes run everywhere else).
    check_run "allreduce, float, 4 B-64 KiB, 5% loss on host 2's link" 3 "$cluster" run --timeout 60 -- \
      "$perf" allreduce -b 4 -e 64K -f 128 -n 1 -w 0 -d float
    # 90 s: under loss one 1 MiB call took 3.6-5.8 s in CI, and a run of 45 s timed out after its
    # last row (every result right) while the ranks were closing.
    check_run "allreduce, float, 256 KiB and 1 MiB, 5% loss on host 2's link" 3 "$cluster" run --timeout 90 -- \
      "$perf" allreduce -b 256K -e 1M -f 4 -n 1 -w 0 -d float
    stats=$("$cluster" status | grep "${CLUSTER_NAME}h2:")
    echo "$stats"
    # ", loss 5%: dropped A of B frames from it, C of D to it": both ways near 5%.
    read -r a b c d < <(sed 's/.*dropped \([0-9]*\) of \([0-9]*\) frames from it, \([0-9]*\) of \([0-9]*\) to it.*/\1 \2 \3 \4/' <<<"$stats")
    awk -v a="$a" -v b="$b" -v c="$c" -v d="$d" 'BEGIN {
      printf "measured loss: %.2f%% of %d frames from host 2, %.2f%% of %d to it\n", 100*a/b, b, 100*c/d, d
      exit !(b >= 2000 && d >= 2000 && a/b > 0.035 && a/b < 0.065 && c/d > 0.035 && c/d < 0.065) }' ||
      fail "the link did not lose about 5% of its frames each way"
    retrans=0
    for h in 1 2; do
      n=$(ip netns exec "${CLUSTER_NAME}h$h" nstat -asz TcpRetransSegs | awk '$1 == "TcpRetransSegs" {print $2}')
      echo "host $h: TCP retransmitted ${n:-0} segments"
      retrans=$((retrans + ${n:-0}))
    done
    [ "$retrans" -gt 0 ] || fail "no TCP retransmission across the lossy link"
    ;;
  mitm)
    # A man in the middle between two hosts (issue 45): relays in hosts 1 and 2 that their
    # connections to each other are sent through (nftables DNAT in each one's output hook; a
    # relay's own connections, marked 42, pass), which flip a bit of, replay, drop or reorder one
    # record host 1 sends to host 2 on the first encrypted data connection, whichever end made
    # it (host 1's relay tampers with what its connector sends, host 2's with what its acceptor
    # answers). Every rank must fail its allreduce naming what happened (rank 2, the receiver,
    # first; ranks 0 and 1 through its notice), and no wrong value may be delivered
    # (netfault_rank checks every element). Both modes of RINGREDUCE_ENCRYPT, with the same
    # messages: psk (keys from RINGREDUCE_TOKEN), then tls (keys from a TLS 1.3 handshake with
    # certificates, whose records the relays pass untouched: they must have seen it go by). The
    # certificates are made for the run: a CA and one leaf signed by it that every rank presents.
    command -v nft >/dev/null || { echo "skipped: needs nftables (nft)"; exit 77; }
    command -v openssl >/dev/null || { echo "skipped: needs the openssl CLI (tls's certificates)"; exit 77; }
    tls=$work/tls
    mkdir "$tls" || fail "mkdir $tls"
    printf '%s\n' '[req]' 'distinguished_name = dn' 'prompt = no' '[dn]' 'CN = placeholder' \
      '[v3_ca]' 'basicConstraints = critical,CA:TRUE' 'keyUsage = critical,keyCertSign,cRLSign' \
      'subjectKeyIdentifier = hash' '[v3_leaf]' 'basicConstraints = CA:FALSE' \
      'keyUsage = critical,digitalSignature' 'extendedKeyUsage = serverAuth,clientAuth' >"$tls/openssl.cnf"
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    (cd "$tls" &&
      timeout 30 openssl req -x509 -config openssl.cnf -extensions v3_ca "${ec[@]}" -keyout ca.key \
        -out ca.crt -days 2 -subj /CN=ringreduce-mitm-ca &&
      timeout 30 openssl req -new -config openssl.cnf "${ec[@]}" -keyout rank.key -out rank.csr \
        -subj /CN=ringreduce-mitm-rank &&
      timeout 30 openssl x509 -req -in rank.csr -CA ca.crt -CAkey ca.key -set_serial 2 -days 2 \
        -extfile openssl.cnf -extensions v3_leaf -out rank.crt) >"$tls/openssl.log" 2>&1 ||
      { cat "$tls/openssl.log"; fail "openssl: the run's certificates"; }
    "$cluster" up 3 --rate 10gbit || fail "cluster up"
    for h in 1 2; do
      me=10.213.77.$((h + 1)) other=10.213.77.$((3 - h + 1))
      printf '%s\n' "table ip mitm { chain out { type nat hook output priority -100; meta mark != 42 ip daddr $other meta l4proto tcp dnat to $me:40999; }; }" |
        ip netns exec "${CLUSTER_NAME}h$h" nft -f - || fail "nft: the relay's DNAT on host $h"
    done
    for encrypt in psk tls; do
      if [ $encrypt = psk ]; then
        env=(--env RINGREDUCE_TOKEN=mitm-token --env RINGREDUCE_ENCRYPT=psk)
      else
        env=(--env RINGREDUCE_ENCRYPT=tls --env "RINGREDUCE_TLS_KEY=$tls/rank.key"
             --env "RINGREDUCE_TLS_CERT=$tls/rank.crt" --env "RINGREDUCE_TLS_CA=$tls/ca.crt")
      fi
      for mode in flip replay drop reorder; do
        case $mode in
          flip) says="altered" ;;
          replay) says="replayed" ;;
          *) says="dropped or reordered" ;;
        esac
        run=$encrypt.$mode
        rm -rf "$work/ready" "$work"/relay-up.* && mkdir "$work/ready"
        for h in 1 2; do
          dir=c2s && [ $h = 2 ] && dir=s2c
          "$cluster" exec $h -- python3 "$here/mitm_relay.py" $mode 10.213.77.$((h + 1)) 40999 300 42 \
            "$work/relay-up.$h" $dir $encrypt >"$work/relay.$run.$h" 2>&1 &
          relays+=" $!"
        done
        for _ in $(seq 1 100); do  # bounded: 10 s
          [ -f "$work/relay-up.1" ] && [ -f "$work/relay-up.2" ] && break
          sleep 0.1
        done
        [ -f "$work/relay-up.1" ] && [ -f "$work/relay-up.2" ] ||
          { cat "$work"/relay.$run.*; fail "$run: the relays did not start"; }
        "$cluster" run --timeout 60 "${env[@]}" --env RINGREDUCE_TIMEOUT=20 -- \
          "$build/tests/multiprocess/netfault_rank" 1 30 "$work/ready" >"$work/out.$run" 2>&1
        rc=$?
        # shellcheck disable=SC2086
        kill $relays 2>/dev/null
        # shellcheck disable=SC2086
        wait $relays 2>/dev/null
        relays=""
        cat "$work"/relay.$run.* | grep -q "mitm: $mode on record 300" ||
          { cat "$work"/relay.$run.* "$work/out.$run"; fail "$run: no relay reached record 300"; }
        # tls: the handshake's records went through the relay that tampered, untouched.
        [ $encrypt = psk ] || cat "$work"/relay.$run.* | grep -q "mitm: [1-9][0-9]* TLS records passed" ||
          { cat "$work"/relay.$run.* "$work/out.$run"; fail "$run: no TLS handshake seen before the records"; }
        ! grep -q WRONG "$work/out.$run" || { cat "$work/out.$run"; fail "$run: a wrong value was delivered"; }
        [ $rc -eq 0 ] || { cat "$work/out.$run"; fail "$run: a rank did not fail, or failed wrongly (rc $rc)"; }
        grep -q "^\[2\] RESULT rank 2 PeerError peer 1 .*data from rank 1 failed its integrity check (RINGREDUCE_ENCRYPT): $says" \
          "$work/out.$run" || { cat "$work/out.$run"; fail "$run: rank 2 did not name rank 1 and '$says'"; }
        for r in 0 1; do
          grep -q "^\[$r\] RESULT rank $r .*integrity check (RINGREDUCE_ENCRYPT): $says" "$work/out.$run" ||
            { cat "$work/out.$run"; fail "$run: rank $r did not learn what happened"; }
        done
        grep "RESULT rank 2" "$work/out.$run" | cut -c1-220
      done
      echo "ok: $encrypt: a bit flipped, a record replayed, dropped, reordered on the way: every rank named it, no wrong value"
    done
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
