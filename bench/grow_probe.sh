#!/usr/bin/env bash
# bench/grow_probe.sh BUILD - Open MPI's dynamic processes after a loss, the cases that
# decide how a Rekindle job grows (bench/mpi_grow_probe.c; docs/LAUNCHER.md, "Why a job
# grows by a relaunch"): a newcomer spawned by the survivors joins (times printed), and a
# newcomer that dies before the merge leaves the survivors inside MPI_Intercomm_merge
# until this script's bound (20 s) stops them. Then connect/accept over MPI_COMM_SELF, one
# intercommunicator a pair and no merge (bench/mpi_connect_probe.c): the newcomer alive,
# dead before any accept, dead after the first; and a spawn by every member together: the
# newcomer alive, dead after MPI_Init, gone before it; and a spawn on a thread beside the
# members' own messages (thread, thread-noinit); and the spawn and merge by every member on a
# thread, given up on at 3 s (merge, merge-dies, merge-noinit).
set -uo pipefail
build=${1:-build}
bin="$build/bench/mpi_grow_probe"
[[ -x $bin ]] || { echo "grow_probe: skipped: $bin is not built (make bench)"; exit 0; }
run() {
  local bin=${2:-$bin}
  local t0=$SECONDS out rc
  out=$(timeout 20 mpirun --oversubscribe $([[ $(id -u) == 0 ]] && echo --allow-run-as-root) --enable-recovery \
        --mca orte_abort_on_non_zero_status 0 --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none \
        -n 3 "$bin" "$1" 2>&1)
  rc=$?
  grep -E '^(rank|child|newcomer)' <<<"$out" | sed "s/^/grow_probe: $1: /"
  echo "grow_probe: $1: exit $rc after $((SECONDS - t0)) s$([[ $rc == 124 ]] && echo ' (stopped at the bound: it hung)')"
}
run ok
run die
for m in ok early middle group group-dies group-noinit thread thread-noinit merge merge-dies merge-noinit; do run "$m" "$build/bench/mpi_connect_probe"; done
