#!/usr/bin/env bash
# bench/grow_inplace.sh BUILD [--zero] - growth onto a spare held back at launch, in place against
# its peer, the relaunch, on the same job on this host: rk-train -n 3 --spares 1 under
# `rekindle run` (checkpoints every 50 steps), asked to grow by RK_RUN_DIR/grow once its
# first checkpoint is committed, with --grow inplace (the default) and --grow relaunch,
# interleaved, the order swapped every round. Per run: the time from the request to every worker of the grown job resumed
# (the last of their `resumed` events at world 4), the steps discarded (rank 0's last step
# printed at world 3, plus one, minus the step resumed at world 4), and whether workers 0-2
# kept their processes (the PIDs the last launch recorded are those they had before the
# request). Then
# the cost of a spare that dies while joining (RK_FAULT on the spare at each point of its
# join, recover/recovery.c G4): from the request to the three resumed at world 3.
# RK_BENCH_GROW_RUNS runs of each (default 5); medians and the ratio. With --zero the job is
# rk-train --zero (Adam's moments sharded, a per-rank RNG: its slices re-split 3 -> 4 in
# the members' memory, docs/SHARDING.md "Growing in place").
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "$build" && pwd)/bin
[[ -x $bin/rk-train && -x $bin/rekindle ]] || { echo "grow_inplace: skipped: $build/bin is not built"; exit 0; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rekindle-bench-grow-inplace.XXXXXX") ||
  { echo "grow_inplace: cannot make a work directory under ${TMPDIR:-/tmp}" >&2; exit 2; }
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
runs=${RK_BENCH_GROW_RUNS:-5}
steps=10000
args=(--seed 5 --hidden 32)
[[ ${2:-} == --zero ]] && args+=(--zero)
py=/usr/bin/python3
[[ -x $py ]] || py=python3

# One job: $1 mode (inplace|relaunch), $2 RK_FAULT for the spare ("" none). Prints
# "ms discarded kept": ms from the request to the last `resumed` after it at world $3.
one() {
  local mode=$1 fault=$2 world=$3 w
  w=$(mktemp -d "$work/$1.XXXXXX") || { echo "grow_inplace: cannot make a run directory under $work" >&2; return 1; }
  (
    export RK_CKPT_DIR=$w/c RK_CKPT_EVERY=50 RK_KEEP=1000 RK_EVENT_LOG=$w/ev RK_RUN_DIR=$w/run
    [[ -n $fault ]] && export RK_FAULT=$fault CHAOS_FAULT_RANK=3
    "$bin/rekindle" run -n 3 --spares 1 --grow "$mode" -- "$here/chaos/worker.sh" "$bin/rk-train" \
      --steps $steps "${args[@]}" > "$w/out" 2>&1 &
    job=$!
    for i in $(seq 6000); do grep -qs '"ckpt_committed"' "$w/ev.0" && break; sleep 0.01; done
    pgrep -f "^$bin/rk-train --steps $steps ${args[*]}\$" > "$w/pids"
    echo "$i polls for the first commit, $(wc -l < "$w/pids") trainers running at the request" > "$w/polls"
    date +%s%N > "$w/t0"
    echo 1 > "$w/run/grow"
    wait $job
    echo $? > "$w/exit"
  )
  "$py" - "$w" "$world" <<'EOF'
import glob, json, os, re, sys
w, world = sys.argv[1], int(sys.argv[2])
t0 = int(open(w + "/t0").read())
res = []
for f in glob.glob(w + "/ev.*"):
    for line in open(f):
        e = json.loads(line)
        if e.get("event") == "resumed" and e["t_ns"] > t0 and e.get("world") == world:
            res.append((e["t_ns"], e["step"]))
last3 = -1
for line in open(w + "/out"):
    m = re.match(r"step (\d+) loss \S+ world 3$", line)
    if m:
        last3 = max(last3, int(m.group(1)))
pids = set(open(w + "/pids").read().split())
last = max(int(d.split("-")[1]) for d in os.listdir(w + "/run") if d.startswith("attempt-"))
kept = 0
for r in range(3):  # the processes that trained at the end: the last attempt's
    try:
        m = re.search(r"pid (\d+)", open("%s/run/attempt-%d/rank-%d" % (w, last, r)).read())
        kept += bool(m and m.group(1) in pids)
    except OSError:
        pass
if not res:
    # Say what happened instead: the job's exit, the launcher's lines, the resumes.
    sys.stderr.write("grow_inplace: no worker resumed at world %d after the request (exit %s; %s):\n" %
                     (world, open(w + "/exit").read().strip(), open(w + "/polls").read().strip()))
    for line in open(w + "/out"):
        if not line.startswith("step ") and "WARN" not in line:
            sys.stderr.write("  " + line)
    for f in sorted(glob.glob(w + "/ev.*")):
        for line in open(f):
            if '"resumed"' in line or '"admit_asked"' in line or '"peer_dead"' in line:
                sys.stderr.write("  " + line)
    print("nan nan %d" % kept)
else:
    first = min(res)
    # the grown ring's resume: the events of its first recovery (every member's, within 1 s)
    grown = [x for x in res if x[0] - first[0] < 1e9]
    print("%.1f %d %d" % ((max(grown)[0] - t0) / 1e6, last3 + 1 - first[1], kept))
EOF
  rm -rf "$w/c" # its checkpoints (600-800 MB a run, RK_KEEP=1000): read, no longer needed
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }

: > "$work/inplace" ; : > "$work/relaunch"
for i in $(seq "$runs"); do
  order="inplace relaunch"
  ((i % 2 == 0)) && order="relaunch inplace" # rotated: neither way always takes the later turn
  for mode in $order; do
    r=$(one $mode "" 4) || exit 1
    echo "grow_inplace: run $i $mode: $r (ms from the request to the grown job resumed, steps discarded, of 3 workers kept)"
    echo "$r" >> "$work/$mode"
  done
done
ip=$(cut -d' ' -f1 "$work/inplace" | median) rl=$(cut -d' ' -f1 "$work/relaunch" | median)
echo "grow_inplace: request -> 4 workers resumed: in place p50 $ip ms, by relaunch p50 $rl ms (the peer)," \
     "ratio $(awk -v a="$rl" -v b="$ip" 'BEGIN {printf "%.1f", (b > 0 ? a / b : 0)}')x;" \
     "steps discarded p50 $(cut -d' ' -f2 "$work/inplace" | median) in place, $(cut -d' ' -f2 "$work/relaunch" | median) by relaunch;" \
     "workers kept p50 $(cut -d' ' -f3 "$work/inplace" | median) of 3 in place, $(cut -d' ' -f3 "$work/relaunch" | median) by relaunch"
for fault in join@0=crash rebuild@0=crash join@1=crash allreduce@0=crash; do
  : > "$work/f"
  for i in $(seq "$runs"); do r=$(one inplace "$fault" 3) || exit 1; echo "${r%% *}" >> "$work/f"; done
  echo "grow_inplace: spare killed at $fault: request -> the 3 resumed at world 3: p50 $(median < "$work/f") ms" \
       "(runs: $(tr '\n' ' ' < "$work/f"))"
done
