#!/usr/bin/env bash
# bench/wedge.sh BUILD [RUNS] - what a survivor's MPI does when its peer is SIGKILLed in
# the middle of a transfer, per Open MPI transport and direction (bench/bench_wedge.c):
# survived, wedged (one MPI call never returned), or aborted by Open MPI. RUNS per cell
# (default RK_BENCH_WEDGE_RUNS, else 20; about 2 s each). docs/RING.md, "Transport", has
# the figures.
set -u
build=${1:-build}
runs=${2:-${RK_BENCH_WEDGE_RUNS:-20}}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
prog="$build/bench/bench_wedge"
[[ -x $prog ]] || { echo "wedge.sh: $prog is not built (make bench)" >&2; exit 1; }
for btl in self,vader self,tcp; do
  for dir in recv send; do
    # fast boxes off: every message of the shared-memory transport goes through the queue
    extra=(); [[ $btl == self,vader && $dir == recv ]] && extra=(--mca btl_vader_fbox_threshold 1000000000)
    s=0 w=0 a=0
    for ((i = 0; i < runs; i++)); do
      out=$(timeout 30 mpirun --oversubscribe -n 2 --enable-recovery --mca orte_abort_on_non_zero_status 0 \
              --mca btl "$btl" --mca btl_vader_single_copy_mechanism none "${extra[@]}" "$prog" "$dir" 2>/dev/null)
      case "$out" in *wedged*) w=$((w + 1)) ;; *survived*) s=$((s + 1)) ;; *) a=$((a + 1)) ;; esac
    done
    printf 'btl %-10s victim %-9s runs %3d  survived %3d  wedged %3d  aborted %3d\n' "$btl" \
      "$([[ $dir == recv ]] && echo sends || echo receives)" "$runs" "$s" "$w" "$a"
  done
done
