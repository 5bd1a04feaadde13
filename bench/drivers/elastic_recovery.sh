#!/usr/bin/env bash
# From a SIGKILL to the first exact allreduce after it, two ways, side by side on one host:
#   shrink   the survivors shrink their communicator and go on (tests/multiprocess/shrink_rank
#            coll), ranks started by hand as ringrun --elastic would
#   restart  torchrun --max-restarts 1 (--monitor-interval 0.1, its quickest) restarts every rank
#            of the same C++ job (shrink_rank restart): new processes, a new rendezvous through
#            its agent's store. A torch program pays `import torch` and its own reload on top.
# Rounds interleave the two; each line is one round's slowest survivor.
#
#   bench/drivers/elastic_recovery.sh [BUILD_DIR] [N] [ROUNDS]      (defaults: build 8 3)
set -uo pipefail
build=$(realpath "${1:-build}")
n=${2:-8}
rounds=${3:-3}
rank=$build/tests/multiprocess/shrink_rank
[ -x "$rank" ] || { echo "no $rank: build first"; exit 1; }
py=/usr/bin/python3
"$py" -c 'import torch.distributed.run' 2>/dev/null || { echo "no torch for torchrun in $py"; exit 1; }
# torch 1.13 on Python 3.11: its default --redirects/--tee do not parse (tests/python/test_torchrun.py).
workaround=()
"$py" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2 and sys.version_info >= (3, 11))' ||
  workaround=(--redirects 1 --tee 1)
victim=$((n / 2 + 1))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

shrink_round() {
  local port pids=() r worst=0 t
  port=$(free_port)
  for ((r = 0; r < n; r++)); do
    env RINGREDUCE_RANK=$r RINGREDUCE_WORLD_SIZE=$n RINGREDUCE_ADDR=127.0.0.1:$port \
      timeout 60 "$rank" coll "$victim" $((n - 1)) 10 >"$work/s$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for ((r = 0; r < n; r++)); do
    [ "$r" = "$victim" ] && continue
    t=$(sed -n 's/.*recovered after \([0-9.]*\) s.*/\1/p' "$work/s$r")
    [ -n "$t" ] || { echo "shrink: rank $r printed no result"; cat "$work/s$r"; return 1; }
    worst=$(awk -v a="$worst" -v b="$t" 'BEGIN { print (b > a ? b : a) }')
  done
  echo "$worst"
}

restart_round() {
  local port
  port=$(free_port)
  rm -f "$work/t"
  RR_RESTART_FILE=$work/t timeout 120 "$py" -m torch.distributed.run --nnodes 1 \
    --nproc_per_node "$n" --master_addr 127.0.0.1 --master_port "$port" --max_restarts 1 \
    --monitor_interval 0.1 "${workaround[@]}" --no_python "$rank" restart "$victim" "$n" 10 \
    >"$work/r" 2>&1
  sed -n 's/.*recovered after \([0-9.]*\) s.*/\1/p' "$work/r" | sort -g | tail -1
}

echo "# $n ranks on $(nproc) cores, rank $victim SIGKILLed inside a 1 MiB/rank allreduce; seconds"
echo "# from the kill to the slowest survivor's first exact allreduce after it ($(date -u +%FT%TZ))"
printf "%-6s %-8s %-8s\n" round shrink restart
for ((i = 1; i <= rounds; i++)); do
  s=$(shrink_round) || exit 1
  r=$(restart_round)
  printf "%-6s %-8s %-8s\n" "$i" "$s" "${r:-failed}"
done
