#!/usr/bin/env bash
# bench/snapshot_cuda.sh BUILD - a snapshot of 1, 4 and 16 GiB of device state against the
# bare pinned D2H copy of the same bytes in the same run (bench/bench_snapshot_cuda.c, one
# process a size): the copy into staging over the bare copy (goal <= 1.1x), the time
# training waits inside rk_step_done, and the wait at rk_before_update when GPU work
# overlaps the copy (goal ~0). RK_BENCH_SNAPSHOT_CUDA_SIZES="1G 4G 16G" to change the sizes;
# the whole stays within RK_BENCH_BUDGET_S (90) seconds: a size is not started with less
# than 10 s + 2 s a GiB left (reported NOT RUN), and one still running at the budget is
# killed. Where it cannot run (a build without CUDA, no device) it says so and exits 0; a
# size that does not fit in device or host memory is skipped with the reason. Stopped from
# outside (SIGTERM), it still prints its last line with what it measured.
set -u
build=${1:-build}
bin="$build/bench/bench_snapshot_cuda"
sizes=${RK_BENCH_SNAPSHOT_CUDA_SIZES:-1G 4G 16G}
budget=${RK_BENCH_BUDGET_S:-90}
if [[ ! -x $bin ]]; then
  echo "snapshot_cuda: skipped: $bin is not built (a build without CUDA)"
  exit 0
fi
start=$SECONDS
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
status=0 measured=() worst_ratio=0 worst_at="" worst_stall=0 skipped=() current=
finish() {
  if [[ ${#measured[@]} -eq 0 ]]; then
    echo "snapshot_cuda: nothing measured (${skipped[*]})"
    return 1
  fi
  local met
  met=$(awk -v a="$worst_ratio" 'BEGIN {print (a <= 1.1) ? "met" : "NOT met"}')
  echo "snapshot_cuda: ${measured[*]}: worst copy into staging ${worst_ratio}x the bare pinned D2H (at $worst_at; goal <= 1.1x: $met); worst training stall with the copy overlapped ${worst_stall} ms$([[ ${#skipped[@]} -gt 0 ]] && echo "; not measured: ${skipped[*]}")"
}
trap 'skipped+=("${current:-?} (stopped from outside)"); finish; exit 1' TERM INT
for sz in $sizes; do
  current=$sz
  left=$((budget - (SECONDS - start)))
  gib=$(awk -v s="$sz" 'BEGIN {n = s + 0; print (s ~ /[Mm]/) ? int(n / 1024) : n}')
  if [[ $left -lt $((10 + 2 * gib)) ]]; then
    echo "snapshot_cuda: $sz: NOT RUN: $left s of the ${budget} s budget left, it needs $((10 + 2 * gib))"
    skipped+=("$sz (not run)")
    status=1
    continue
  fi
  timeout -k 5 "$left" "$bin" "$sz" 2>&1 | tee "$out" | grep -v '^RESULT '
  rc=${PIPESTATUS[0]}
  case $rc in
    0)
      r=$(sed -n 's/^RESULT .* ratio=\([0-9.]*\) .*overlap_stall_ms=\([0-9.]*\).*/\1 \2/p' "$out")
      [[ -n $r ]] || { echo "snapshot_cuda: $sz: FAILED: no RESULT line"; status=1; continue; }
      measured+=("$sz")
      read -r ratio ostall <<<"$r"
      if awk -v a="$ratio" -v b="$worst_ratio" 'BEGIN {exit !(a > b)}'; then worst_ratio=$ratio worst_at=$sz; fi
      if awk -v a="$ostall" -v b="$worst_stall" 'BEGIN {exit !(a > b)}'; then worst_stall=$ostall; fi
      ;;
    77) exit 0 ;; # no device: its line said why, and is the last
    3) skipped+=("$sz (does not fit)") ;;
    124 | 137)
      echo "snapshot_cuda: $sz: FAILED: still running after $left s (killed)"
      skipped+=("$sz (killed)")
      status=1
      ;;
    *)
      echo "snapshot_cuda: $sz: FAILED (exit $rc)"
      skipped+=("$sz (failed)")
      status=1
      ;;
  esac
done
finish || exit 1
exit $status
