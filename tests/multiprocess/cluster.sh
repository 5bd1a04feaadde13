#!/usr/bin/env bash
# Launch tests on an emulated cluster (scripts/cluster): each case brings up its own namespaces
# under its own name, runs real launches of ringreduce-perf across them, and takes them down from
# an EXIT trap, pass or fail. Traffic stays inside the namespaces.
#   ipv4      3 hosts x 2 ranks (shared memory inside a host, TCP between): every collective,
#             dtype and op; interface selection (auto past a docker0 bridge, =eth0, an exclusion
#             that leaves only loopback);
#             the star allreduce forced
#   ipv6      2 hosts with IPv6 addresses only: allreduce and allgather, every dtype
#   mpirun    OpenMPI's mpirun over 2 hosts x 2 slots (its rsh agent enters the namespaces)
#   slurm     Slurm's variables, set by hand as srun would, 2 hosts x 2 ranks
#   torchrun  torchrun's variables, 3 hosts x 1 rank
# Usage: cluster.sh CASE BUILD_DIR. Exit 77 = skipped (not root, or no network namespaces).
set -uo pipefail
case_name=$1
build=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../scripts/cluster
perf=$build/tools/ringreduce-perf
# One cluster name per case, so that cases can run side by side.
export CLUSTER_NAME=rrt${case_name:0:4}

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
cleanup() {
  "$cluster" down
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
    echo "$out" | tail -40
    fail "$what (rc $rc)"
  fi
  echo "ok: $what ($(grep -c '^\[0\] \{3,\}[0-9]' <<<"$out") rows)"
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
    for coll in allreduce reduce_scatter allgather broadcast reduce alltoall; do
      check_run "$coll, 3 hosts x 2 ranks" 6 "$cluster" run --ranks-per-host 2 --timeout 120 -- \
        "$perf" "$coll" -b 4 -e 1M -f 32 -n 2 -w 1 -d all -o all -r 5
    done
    check_run "allreduce, RINGREDUCE_SOCKET_IFNAME==eth0" 3 "$cluster" run --timeout 60 \
      --env RINGREDUCE_SOCKET_IFNAME==eth0 -- "$perf" allreduce -b 4 -e 1M -f 32 -n 2 -w 1
    check_run "allreduce, star forced" 3 "$cluster" run --timeout 60 --env RINGREDUCE_ALGO=allreduce:star -- \
      "$perf" allreduce -b 4 -e 4M -f 8 -n 2 -w 1 -d all -o all
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
  torchrun)
    "$cluster" up 3 --rate 10gbit || fail "cluster up"
    check_run "broadcast with torchrun's variables, 3 hosts" 3 "$cluster" run --launcher torchrun \
      --timeout 120 -- "$perf" broadcast -b 4 -e 1M -f 32 -n 2 -w 1 -r 2 -d all
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
