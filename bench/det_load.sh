#!/usr/bin/env bash
# bench/det_load.sh BUILD [PAIRS] - the detector thread's turns on a loaded machine
# (docs/DETECTOR.md, "On a loaded machine"), its real-time priority against none in the
# same run. A load of MPI jobs that busy-poll (RK_BENCH_DET_LOAD background `rk-train`
# jobs of 3 workers each, default 2, relaunched as they end), then PAIRS (default 3) pairs
# of the same job, one with RK_DET_RT=0 and one with the default, interleaved: 3 workers of
# tests/prog_update (3000 steps) under `rekindle run`. Per run: the detector's late turns
# (its WARN "detector thread late by X ms"), the worst of them, and live workers declared
# dead (peer_dead events: no worker is killed, so every one is a false death). The last
# line sums each mode up, after bench/wake_probe.py beside the same load (20 s at normal
# priority, 20 s under `chrt -r 1`: a sleeping process's wake, apart from Rekindle). Needs
# the tests built (make build-tests); says why and exits 0 when it cannot run. At most
# 190 s a pair (~60 s at load 8), plus 50 s.
set -uo pipefail
build=${1:-build}
pairs=${2:-3}
nload=${RK_BENCH_DET_LOAD:-2}
prog="$build/tests/prog_update" rekindle="$build/bin/rekindle" train="$build/bin/rk-train"
for f in "$prog" "$rekindle" "$train"; do
  [[ -x $f ]] || { echo "det_load: skipped: $f is not built (make build-tests)"; exit 0; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/rk-det-load.XXXXXX") || { echo "det_load: cannot make a work directory"; exit 1; }
loads=()
# The loads end by SIGTERM to their process groups (rekindle run then stops its job), then
# SIGKILL to what is left of them after 10 s.
cleanup() {
  for p in "${loads[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
  for t in $(seq 100); do
    alive=0
    for p in "${loads[@]}"; do kill -0 -- "-$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for p in "${loads[@]}"; do kill -9 -- "-$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' TERM INT
for i in $(seq 1 "$nload"); do
  setsid bash -c "while :; do RK_CKPT_DIR= '$rekindle' run -n 3 -- '$train' --steps 20000 --hidden 32 \
                  > /dev/null 2>&1; done" &
  loads+=($!)
  disown
done
sleep 3
declare -A late worst lost runs
for m in off on; do late[$m]=0 worst[$m]=0 lost[$m]=0 runs[$m]=0; done
for i in $(seq 1 "$pairs"); do
  for m in off on; do
    d="$work/$m-$i"
    mkdir -p "$d"
    if [[ $m == off ]]; then rt=(env RK_DET_RT=0); else rt=(env -u RK_DET_RT); fi
    RK_CKPT_DIR="$d/c" RK_CKPT_EVERY=50 RK_EVENT_LOG="$d/ev" RK_TIMEOUT_MS=8000 \
      timeout -k 5 90 "${rt[@]}" "$rekindle" run -n 3 -- "$prog" 3000 -1 -1 > "$d/out" 2> "$d/err"
    rc=$?
    n=$(grep -c 'late by' "$d/err")
    w=$(grep -o 'late by [0-9]*' "$d/err" | awk '{print $3}' | sort -n | tail -n 1)
    dead=$(cat "$d"/ev.* 2>/dev/null | grep '"peer_dead"' | grep -c '"via": "silence"')
    echo "det_load: RK_DET_RT $m, run $i: exit $rc, $n late turns (worst ${w:-0} ms), $dead false deaths, load $(cut -d' ' -f1 /proc/loadavg)"
    runs[$m]=$((runs[$m] + 1)) late[$m]=$((late[$m] + n)) lost[$m]=$((lost[$m] + dead))
    [[ ${w:-0} -gt ${worst[$m]} ]] && worst[$m]=${w:-0}
  done
done
# The mechanism apart from Rekindle, beside the same load: bench/wake_probe.py.
probe="$(dirname "$0")/wake_probe.py"
if command -v python3 > /dev/null; then
  echo "det_load: normal priority: $(python3 "$probe" 20)"
  if chrt -r 1 true 2> /dev/null; then
    echo "det_load: SCHED_RR 1: $(chrt -r 1 python3 "$probe" 20)"
  else
    echo "det_load: SCHED_RR 1: not allowed here, the probe not run under it"
  fi
fi
echo "det_load: $nload loading jobs; real-time off: ${late[off]} late turns in ${runs[off]} runs (worst ${worst[off]} ms), ${lost[off]} false deaths; real-time on (the default): ${late[on]} late turns (worst ${worst[on]} ms), ${lost[on]} false deaths"
