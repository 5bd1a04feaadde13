# shellcheck shell=bash
# Slurm on the emulated cluster (sourced by scripts/cluster: `cluster up N --slurm`, `cluster
# down`). Debian's slurmctld, slurmd, slurm-client and munge, configured per run:
#   - node i is named after its namespace (NAMEh<i>), at its address; slurmctld runs on node 0;
#     one slurmd per node, each in its namespace and in a UTS namespace of its own whose host name
#     is the node's name (so a job's `hostname` is its node's, as on a real cluster);
#   - the configuration (slurm.conf, cgroup.conf) goes to /etc/netns/<namespace>/slurm beside the
#     hosts file naming every node (cluster up), which `ip netns exec` binds over /etc: every process of a host,
#     the daemons, the jobs and `cluster exec` alike, finds /etc/slurm/slurm.conf and resolves
#     the node names, so srun, sbatch and `scontrol show hostnames` work unchanged;
#   - a munge key made per run and a munged of its own (its socket in the state directory);
#   - slurmd wants cgroups mounted at /sys/fs/cgroup, which `ip netns exec` hides behind a fresh
#     sysfs: each daemon mounts the v1 hierarchies there again, in its private mount namespace.
# Everything lives in $STATE_DIR/$NAME.slurm (logs in log/); slurm_down stops the daemons by PID
# and removes it, the /etc/netns files and the cgroups the daemons made.

slurm_dir() { echo "$STATE_DIR/$NAME.slurm"; }

slurm_down() {
  local d pid n i
  d=$(slurm_dir)
  [ -d "$d" ] || return 0
  if [ -f "$d/pids" ]; then
    while read -r pid; do kill -TERM "$pid" 2>/dev/null; done <"$d/pids"
    for i in $(seq 1 30); do
      n=0
      while read -r pid; do kill -0 "$pid" 2>/dev/null && n=1; done <"$d/pids"
      [ "$n" = 0 ] && break
      sleep 0.1
    done
    while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$d/pids"
  fi
  # Job steps whose slurmd was killed: their processes carry the node name in SLURMD_NODENAME.
  for pid in $(pgrep -f slurmstepd 2>/dev/null); do
    grep -qz "^SLURMD_NODENAME=${NAME}h" /proc/"$pid"/environ 2>/dev/null && kill -KILL "$pid"
  done
  [ -f "$d/munged.pid" ] && kill -TERM "$(cat "$d/munged.pid")" 2>/dev/null
  for n in /etc/netns/"${NAME}"h[0-9]*; do rm -rf "$n/slurm"; done
  # The cgroups slurmd made for its nodes (one directory per node and controller).
  find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -name "slurm_${NAME}h*" 2>/dev/null |
    sort -r | xargs -r rmdir 2>/dev/null
  rm -rf "$d"
}

# slurm_up HOSTS: after the namespaces are up.
slurm_up() {
  local hosts=$1 d i ns node
  local missing=()
  for c in slurmctld slurmd srun sbatch scontrol munged; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  [ ${#missing[@]} = 0 ] ||
    die "--slurm needs ${missing[*]} (Debian: slurmctld slurmd slurm-client munge)"
  slurm_down
  d=$(slurm_dir)
  mkdir -p "$d/state" "$d/log" "$d/spool"
  head -c 1024 /dev/urandom >"$d/munge.key"
  chmod 400 "$d/munge.key"
  munged --force --key-file="$d/munge.key" --socket="$d/munge.sock" --pid-file="$d/munged.pid" \
    --log-file="$d/log/munged.log" --seed-file="$d/munge.seed" ||
    die "munged did not start (log: $d/log/munged.log)"
  {
    echo "# Made by scripts/cluster up --slurm for the emulated cluster '$NAME'."
    echo "ClusterName=$NAME"
    echo "SlurmctldHost=$(ns_host 0)($(addr4 0))"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$d/munge.sock"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$d/state"
    echo "SlurmdSpoolDir=$d/spool/%n"
    echo "SlurmctldPidFile=$d/slurmctld.pid"
    echo "SlurmdPidFile=$d/slurmd.%n.pid"
    echo "SlurmctldLogFile=$d/log/slurmctld.log"
    echo "SlurmdLogFile=$d/log/slurmd.%n.log"
    echo "MailProg=/bin/true"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "ReturnToService=2"
    echo "MpiDefault=none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    # A killed node is noticed within seconds, not the default five minutes.
    echo "SlurmdTimeout=10"
    echo "KillWait=5"
    for i in $(seq 0 $((hosts - 1))); do
      echo "NodeName=$(ns_host "$i") NodeAddr=$(addr4 "$i") CPUs=$(nproc) State=UNKNOWN"
    done
    echo "PartitionName=all Nodes=${NAME}h[0-$((hosts - 1))] Default=YES MaxTime=INFINITE State=UP"
  } >"$d/slurm.conf"
  echo "CgroupPlugin=cgroup/v1" >"$d/cgroup.conf"
  for i in $(seq 0 $((hosts - 1))); do
    ns=$(ns_host "$i")
    mkdir -p "/etc/netns/$ns/slurm"
    cp "$d/slurm.conf" "$d/cgroup.conf" "/etc/netns/$ns/slurm/"
  done
  # What each daemon runs first, in its namespace: its cgroups, and its node's host name.
  # shellcheck disable=SC2016  # expanded by the daemon's shell, not here
  local prelude='mount -t tmpfs cgroup_root /sys/fs/cgroup &&
    for c in cpuset memory devices freezer pids; do
      mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c
    done; hostname "$0"'
  : >"$d/pids"
  ip netns exec "$(ns_host 0)" unshare -u sh -c "$prelude && exec slurmctld -D -i" \
    "$(ns_host 0)" >>"$d/log/slurmctld.out" 2>&1 &
  echo $! >>"$d/pids"
  for i in $(seq 0 $((hosts - 1))); do
    node=$(ns_host "$i")
    ip netns exec "$node" unshare -u sh -c "$prelude && exec slurmd -D -N \"\$0\"" "$node" \
      >>"$d/log/slurmd.$node.out" 2>&1 &
    echo $! >>"$d/pids"
  done
  # Up when every node is idle (bounded: 30 s).
  local idle=0
  for i in $(seq 1 300); do
    idle=$(ip netns exec "$(ns_host 0)" sinfo -h -t idle -o %D 2>/dev/null | head -1)
    [ "${idle:-0}" = "$hosts" ] && break
    sleep 0.1
  done
  [ "${idle:-0}" = "$hosts" ] || {
    tail -n 5 "$d"/log/*.log >&2
    die "Slurm did not come up: ${idle:-0} of $hosts nodes idle after 30 s (logs: $d/log)"
  }
  echo "slurm: slurmctld on $(ns_host 0), slurmd on $(ns_host 0)..$(ns_host $((hosts - 1))); srun and sbatch through 'scripts/cluster exec 0 --'"
}
