#!/usr/bin/env bash
# bench/grow_slow.sh BUILD [D] [RK_TIMEOUT_MS] - growth onto a worker started while the job
# trains whose program is D seconds slow to reach MPI_Init (default 9; the workers launched
# first are not): 2 rk-train workers (--hidden 32, 40,000 steps) on this host under
# `rekindle run --host-discovery-script`, offered a third slot once step 100 is committed.
# Prints when the growth was asked and the job ended (seconds from the launch), the
# launcher's lines and the workers' join lines, and the final lines (their world says
# whether it grew). With D under the spawn's bound (RK_TIMEOUT_MS / 3, at least 6 s) it
# grows in place; over it, the launcher relaunches on the workers' word (docs/LAUNCHER.md,
# "A newcomer slow to start").
set -u
build=$(cd "${1:-build}" && pwd)
delay=${2:-9}
timeout_ms=${3:-5000}
w=$(mktemp -d "${TMPDIR:-/tmp}/rekindle-bench-grow_slow.XXXXXX") ||
  { echo "grow_slow: cannot make a scratch directory under ${TMPDIR:-/tmp}" >&2; exit 2; }
trap 'rm -rf "$w"' EXIT
host=$(hostname)
mkdir -p "$w/run"
echo "$host:2" > "$w/hosts"
export RK_CKPT_DIR=$w/c RK_CKPT_EVERY=50 RK_KEEP=1000 RK_EVENT_LOG= RK_RUN_DIR=$w/run RK_TIMEOUT_MS=$timeout_ms \
    RK_LOG=info RK_LOG_SUBSYS=rec
start=$(date +%s.%N)
"$build/bin/rekindle" run --host-discovery-script "cat $w/hosts" --discovery-interval 0.2 --max-np 3 -- \
    sh -c '[ -n "$RK_RUN_SLOT" ] && sleep '"$delay"'; exec "$0" "$@"' "$build/bin/rk-train" \
    --steps 40000 --seed 5 --hidden 32 > "$w/out" 2> "$w/err" &
job=$!
for _ in $(seq 1200); do [ -d "$w/c/step-000000000100" ] && break; sleep 0.05; done
echo "$host:3" > "$w/hosts"
asked=$(date +%s.%N)
wait $job
rc=$?
ended=$(date +%s.%N)
echo "grow_slow: D=$delay s RK_TIMEOUT_MS=$timeout_ms: exit $rc; asked at $(echo "$asked - $start" | bc) s," \
    "ended at $(echo "$ended - $start" | bc) s"
grep -E 'rekindle: run|join' "$w/err" | grep -v PMIX | cut -c1-300
grep '^final' "$w/out"
