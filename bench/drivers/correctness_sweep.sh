#!/usr/bin/env bash
# The foundation issue's correctness sweep: every collective through ringrun at N ranks, sizes
# 4 B .. 256 MiB (x4), dtypes float, half, bfloat16, double, int32, int64, and (for the reducing
# collectives) ops sum, prod, max, min, avg, each checked exactly (-c 1). Prints one line per run
# and the total of wrong elements; exits non-zero if any run failed or any element was wrong.
#   usage: bench/drivers/correctness_sweep.sh [N] [BUILD_DIR] [MAX_BYTES]
set -uo pipefail
n=${1:-4}
build=${2:-build}
max=${3:-256M}
dtypes="float half bfloat16 double int32 int64"
status=0
total_rows=0
for coll in allreduce reduce_scatter allgather broadcast reduce alltoall; do
  case $coll in allreduce|reduce_scatter|reduce) ops="sum prod max min avg" ;; *) ops="sum" ;; esac
  for d in $dtypes; do
    for o in $ops; do
      out=$(timeout 900 "$build/tools/ringrun" -n "$n" -- "$build/tools/ringreduce-perf" "$coll" \
            -b 4 -e "$max" -f 4 -n 1 -w 1 -c 1 -d "$d" -o "$o" -r $((n - 1)) 2>&1)
      rc=$?
      rows=$(grep -cE '^\[0\] +[0-9]+ ' <<<"$out")
      wrong=$(sed -n 's/.*Out of bounds values : \([0-9]*\).*/\1/p' <<<"$out")
      total_rows=$((total_rows + rows))
      printf '%-15s %-9s %-5s rows=%-3s wrong=%s rc=%s\n' "$coll" "$d" "$o" "$rows" "${wrong:-?}" "$rc"
      if [ "$rc" -ne 0 ] || [ "${wrong:-1}" != 0 ]; then status=1; echo "$out" | tail -20; fi
    done
  done
done
echo "rows checked: $total_rows; $( [ $status -eq 0 ] && echo 'all #wrong 0' || echo FAILURES )"
exit $status
