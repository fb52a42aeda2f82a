#!/usr/bin/env bash
# bench/grow_many.sh BUILD [OTHER_BUILD] [RUNS] [K] - growth in place by K workers at once
# (default 2): 2 rk-train workers (--hidden 32, 6,000 steps, checkpoints every 50) on this
# host under `rekindle run --host-discovery-script`; once step 100 is committed the hosts
# file lists 2 + K slots. Measured: from that listing to the last `resumed` event of a
# world of 2 + K (every worker training on the grown world), the growths the members went
# through on the way (worlds resumed at), and the launcher's own line. With OTHER_BUILD the
# two alternate, the order turned each round (this machine slows after a burst). RUNS per
# build (default 5). Prints one line a run, then the medians. Needs bc.
set -u
builds=("$(cd "${1:-build}" && pwd)")
[ -n "${2:-}" ] && builds+=("$(cd "$2" && pwd)")
runs=${3:-5}
k=${4:-2}
host=$(hostname)
w=$(mktemp -d "${TMPDIR:-/tmp}/rekindle-bench-grow_many.XXXXXX") ||
  { echo "grow_many: cannot make a scratch directory under ${TMPDIR:-/tmp}" >&2; exit 2; }
trap 'rm -rf "$w"' EXIT

one() { # build run-index: prints "ms worlds launcher-ms"
  local b=$1 d=$w/r$2 want=$((2 + k))
  mkdir -p "$d/run"
  echo "$host:2" > "$d/hosts"
  RK_CKPT_DIR=$d/c RK_CKPT_EVERY=50 RK_KEEP=1000 RK_EVENT_LOG=$d/ev RK_RUN_DIR=$d/run RK_TIMEOUT_MS=8000 \
    "$b/bin/rekindle" run --host-discovery-script "cat $d/hosts" --discovery-interval 0.2 --max-np $want -- \
    "$b/bin/rk-train" --steps 6000 --seed 5 --hidden 32 > "$d/out" 2> "$d/err" &
  local job=$!
  for _ in $(seq 1200); do [ -d "$d/c/step-000000000100" ] && break; sleep 0.05; done
  local listed
  listed=$(date +%s%N)
  echo "$host:$want" > "$d/hosts"
  touch "$d/run/grow"
  wait $job
  local last worlds lms
  last=$(grep -h '"resumed"' "$d"/ev.* | grep "\"world\": $want[,}]" | sed 's/.*"t_ns": \([0-9]*\).*/\1/' | sort -n | tail -n 1)
  worlds=$(grep -h '"resumed"' "$d"/ev.* | sed 's/.*"world": \([0-9]*\).*/\1/' | sort -n | uniq | tr '\n' ',' )
  lms=$(sed -n 's/.*grown in place to [0-9]* workers in \([0-9]*\) ms.*/\1/p' "$d/err" | tail -n 1)
  if [ -z "$last" ]; then echo "never worlds=${worlds%,} launcher=${lms:--}"; return; fi
  echo "$(( (last - listed) / 1000000 )) worlds=${worlds%,} launcher=${lms:--}"
  rm -rf "$d"
}

declare -A times
for ((r = 0; r < runs; r++)); do
  order=("${builds[@]}")
  if [ ${#builds[@]} = 2 ] && [ $((r % 2)) = 1 ]; then order=("${builds[1]}" "${builds[0]}"); fi
  for b in "${order[@]}"; do
    res=$(one "$b" "$r")
    echo "grow_many: K=$k run $((r + 1)) $b: listed -> all resumed on $((2 + k)): ${res%% *} ms (${res#* })"
    times[$b]="${times[$b]:-} ${res%% *}"
  done
done
for b in "${builds[@]}"; do
  med=$(echo ${times[$b]} | tr ' ' '\n' | grep -v never | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}')
  echo "grow_many: K=$k $b: median ${med} ms over${times[$b]}"
done
