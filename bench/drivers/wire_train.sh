#!/usr/bin/env bash
# examples/train_ddp.py on an emulated cluster (scripts/cluster: a network namespace per host,
# one rank each, links shaped with tbf at RATE) with each gradient compression in the same run:
# float32 (none), torch's fp16_compress_hook and PowerSGD (rank 2), and ringreduce's wire hooks
# (ringreduce.torch.hooks.wire_hook: bf16, fp8, fp8 with error feedback, ...), all on the
# ringreduce backend. ROUNDS interleaved rounds (the order rotates per round). Prints each run's
# final line and a table per hook: test accuracy, median step time (ms) and training time to the
# target accuracy (s), best / median / worst over the rounds.
#
# usage: bench/drivers/wire_train.sh [-H HOSTS] [-R RATE] [-r ROUNDS] [-k "none fp16 powersgd bf16 fp8 fp8-ef"]
#                            [-- extra train_ddp.py arguments (default: --hidden 1024)]
# Needs root (network namespaces).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
HOSTS=4 RATE=1gbit ROUNDS=3 HOOKS="none fp16 powersgd bf16 bf16-ef fp8 fp8-ef"
while [ $# -gt 0 ]; do
  case "$1" in
    -H) HOSTS=$2; shift 2 ;; -R) RATE=$2; shift 2 ;; -r) ROUNDS=$2; shift 2 ;;
    -k) HOOKS=$2; shift 2 ;; --) shift; break ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
EXTRA=("$@")
[ ${#EXTRA[@]} -gt 0 ] || EXTRA=(--hidden 1024)
[ "$(id -u)" = 0 ] || { echo "wire_train: needs root (network namespaces)" >&2; exit 2; }
export CLUSTER_NAME=rrwt
CLUSTER=$ROOT/scripts/cluster
results=$(mktemp)
trap '"$CLUSTER" down; rm -f "$results"' EXIT
trap 'exit 130' INT
"$CLUSTER" up "$HOSTS" --rate "$RATE" >&2 || exit 1
echo "# $(date -Is) $(uname -srm), $(nproc) cpus; cluster $HOSTS hosts at $RATE; git $(git rev-parse --short HEAD); train_ddp.py ${EXTRA[*]}"
export PYTHONPATH=$ROOT/build/python${PYTHONPATH:+:$PYTHONPATH}
# torch.distributed's env:// from what scripts/cluster gives each rank.
launch='export RANK=$RINGREDUCE_RANK WORLD_SIZE=$RINGREDUCE_WORLD_SIZE MASTER_ADDR=${RINGREDUCE_ADDR%:*} MASTER_PORT=29511 RINGREDUCE_SOCKET_IFNAME=${RINGREDUCE_SOCKET_IFNAME:-eth0}; exec /usr/bin/python3 "$@"'
read -r -a hooks <<<"$HOOKS"
for r in $(seq 1 "$ROUNDS"); do
  k=${#hooks[@]}
  for j in $(seq 0 $((k - 1))); do
    h=${hooks[$(((j + r) % k))]}
    line=$(timeout -k 10 600 "$CLUSTER" run --timeout 600 -- sh -c "$launch" sh \
      "$ROOT/examples/train_ddp.py" --quiet --hook "$h" "${EXTRA[@]}" 2>&1 | sed -n 's/^\[0\] final: //p')
    echo "round $r: ${line:-failed ($h)}"
    [ -n "$line" ] && echo "$line" >>"$results"
  done
done
python3 - "$results" $HOOKS <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kv = dict(x.split("=", 1) for x in line.split())
    rows.setdefault(kv["hook"], []).append(kv)
def bmw(v):
    v = sorted(v)
    return f"{v[0]:.3f} / {statistics.median(v):.3f} / {v[-1]:.3f}"
print("| hook | test accuracy | step ms (best / median / worst) | s to target (best / median / worst) |")
print("|---|---|---|---|")
for h in sys.argv[2:]:
    runs = rows.get(h, [])
    if not runs:
        print(f"| {h} | failed | | |")
        continue
    acc = sorted({r["test_accuracy"] for r in runs})
    print(f"| {h} | {', '.join(acc)} | {bmw([float(r['step_ms_median']) for r in runs])} | "
          f"{bmw([float(r['time_to_target_s']) for r in runs])} |")
PY
