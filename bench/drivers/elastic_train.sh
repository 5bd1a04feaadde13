#!/usr/bin/env bash
# examples/train_elastic.py four ways, in interleaved rounds, 4 ranks: undisturbed; rank 3
# SIGKILLed at step 40 and the others shrink (ringrun --elastic); the same with a replacement
# joining (--replace); and torchrun --max-restarts 1 restarting everyone from the last checkpoint
# (every 10 steps, so step 40's). Per run: seconds from the kill to the first step after it (the
# slowest rank), the world at the end, the test accuracy, and whether every rank ends with the
# same parameters. Needs torch 2.14 (shrink_group, reconfigure): run it in scripts/torch2's sid root,
#
#   scripts/torch2 --suite sid --run bench/drivers/elastic_train.sh [ROUNDS]
set -uo pipefail
rounds=${1:-3}
build=${BUILD:-build}
here=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$build/python RINGREDUCE_BUILD=$build
py=/usr/bin/python3
ex=$here/examples/train_elastic.py
torchrun=(torchrun)
[ "${USE_LIBUV:-1}" = 0 ] && torchrun=("$py" "$here/scripts/torchrun-nolibuv")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

summarize() {  # name, log
  local rec world acc same
  rec=$(grep -o 'after=[0-9.]*' "$2" | cut -d= -f2 | sort -g | tail -1)
  world=$(grep -o 'final: rank=[0-9]* world=[0-9]*' "$2" | head -1 | sed 's/.*world=//')
  acc=$(grep -o 'test_accuracy=[0-9.]*' "$2" | head -1 | cut -d= -f2)
  same=$(grep -o 'param_sum=[0-9.-]*' "$2" | sort -u | wc -l)
  printf "%-10s %-9s %-6s %-9s %s\n" "$1" "${rec:--}" "${world:-?}" "${acc:-?}" \
    "$([ "$same" = 1 ] && echo yes || echo "no ($same)")"
}

echo "# examples/train_elastic.py, 4 ranks, $(nproc) cores, torch $("$py" -c 'import torch; print(torch.__version__)') ($(date -u +%FT%TZ))"
printf "%-10s %-9s %-6s %-9s %s\n" run recover_s world accuracy same_params
for ((i = 1; i <= rounds; i++)); do
  timeout 300 "$build/tools/ringrun" -n 4 "$py" "$ex" >"$work/plain" 2>&1
  summarize undisturbed "$work/plain"
  timeout 300 "$build/tools/ringrun" --elastic -n 4 "$py" "$ex" --kill-step 40 >"$work/shrink" 2>&1
  summarize shrink "$work/shrink"
  timeout 300 "$build/tools/ringrun" --elastic -n 4 "$py" "$ex" --kill-step 40 --replace \
    >"$work/replace" 2>&1
  summarize replace "$work/replace"
  rm -f "$work/ckpt"*
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  timeout 300 "${torchrun[@]}" --nnodes 1 --nproc-per-node 4 --master-addr 127.0.0.1 \
    --master-port "$port" --max-restarts 1 --monitor-interval 0.1 \
    "$ex" --kill-step 40 --checkpoint "$work/ckpt" >"$work/restart" 2>&1
  summarize restart "$work/restart"
done
