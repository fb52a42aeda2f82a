#!/usr/bin/env bash
# bench/ckpt.sh [--against OLD_BUILD] [--pairs N] BUILD - the checkpoint engine against raw
# O_DIRECT, memcpy, HDF5 sec2 (h5py) and torch.save+fsync, 1 GiB and 4 GiB
# (RK_BENCH_CKPT_MIB="1024 4096" to change).
#
# --against OLD_BUILD (or RK_BENCH_AGAINST=OLD_BUILD): an A/B of two builds instead, each
# through its own bench/bench_ckpt (both must print its RESULT line): N pairs (default 3,
# RK_BENCH_PAIRS) of runs alternated old/new, the order swapped every pair so that a drift
# of the disk or of the machine's load weighs on both. Each run measures persist
# (rk_checkpoint + rk_wait) against a raw O_DIRECT write of the same bytes in the same run;
# the ratios persist/raw (raw write time / persist time: 1 is the disk's speed), stall/memcpy
# (a checkpoint step's) and snap/memcpy (an ordinary step's wait for its snapshot; "-" from a
# bench_ckpt that does not measure it) of every run and their medians are printed. Each run
# keeps all its checkpoints: the work directory needs 9 x the size (checked first). An older tree:
#   git worktree add /tmp/rk-old REV && make -C /tmp/rk-old -j2
#   bench/ckpt.sh --against /tmp/rk-old/build build
# (an OLD_BUILD without bench/bench_ckpt whose parent holds a Makefile gets it built there).
set -u
against=${RK_BENCH_AGAINST:-}
pairs=${RK_BENCH_PAIRS:-3}
while [[ $# -gt 0 ]]; do
  case $1 in
    --against) against=${2:?--against needs a build directory}; shift 2 ;;
    --pairs) pairs=${2:?--pairs needs a count}; shift 2 ;;
    -*) echo "usage: bench/ckpt.sh [--against OLD_BUILD] [--pairs N] BUILD" >&2; exit 2 ;;
    *) break ;;
  esac
done
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
work=$(mktemp -d "${RK_BENCH_TMP:-/var/tmp}/rk-bench-ckpt.XXXXXX") || { echo "ckpt: cannot make a work directory under ${RK_BENCH_TMP:-/var/tmp}" >&2; exit 2; }
trap 'rm -rf "$work"' EXIT
# Each bench_ckpt run keeps all its checkpoints (RK_BENCH_ROUNDS + 2: 8 by default) beside a
# raw file of the same size: refused at once where the work directory has not that room.
rounds=${RK_BENCH_ROUNDS:-6}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || rounds=6
# A size without that room is skipped, said; none left is an error.
avail=$(df -Pm "$work" | awk 'NR == 2 { print $4 }')
sizes=""
for mib in ${RK_BENCH_CKPT_MIB:-1024 4096}; do
  need=$(((rounds + 3) * mib))
  if ((avail >= need)); then sizes+=" $mib"; else
    echo "ckpt: $mib MiB skipped: it needs $need MiB free under $work (RK_BENCH_TMP); $avail there" >&2; fi
done
[[ -n $sizes ]] || exit 2
export RK_JOB_SECRET=${RK_JOB_SECRET:-$(printf '%064d' 1)}

if [[ -z $against ]]; then
  for mib in $sizes; do
    rm -rf "${work:?}"/*
    "$build/bench/bench_ckpt" "$work" "$mib" 71 | tee "$work/out" || exit 1
    persist=$(sed -n 's/^RESULT persist_s=\([0-9.]*\).*/\1/p' "$work/out")
    "$py" "$here/ckpt_peers.py" "$work" "$mib" "$persist" || echo "  (python peers not available)"
  done
  exit 0
fi

[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "ckpt: --pairs wants a positive count, not '$pairs'" >&2; exit 2; }
tree=$(dirname "$against")
if [[ ! -x $against/bench/bench_ckpt && -f $tree/Makefile ]]; then
  name=$(basename "$against")
  make -C "$tree" -j2 BUILD="$name" "$name/bench/bench_ckpt" > "$work/make.log" 2>&1 ||
    { tail -20 "$work/make.log" >&2; echo "ckpt: building $against/bench/bench_ckpt failed" >&2; exit 2; }
fi
for b in "$against" "$build"; do
  [[ -x $b/bench/bench_ckpt ]] || { echo "ckpt: no $b/bench/bench_ckpt (make BUILD=$b $b/bench/bench_ckpt)" >&2; exit 2; }
done

# One run of build $1 at $2 MiB, in a fresh directory: prints
# "persist_s raw_s persist/raw stall/memcpy snap/memcpy".
one() {
  rm -rf "$work/run" && mkdir "$work/run" || return 1
  "$1/bench/bench_ckpt" "$work/run" "$2" 71 > "$work/out" 2>&1 || { sed 's/^/  /' "$work/out" >&2; return 1; }
  awk '/^RESULT / { for (i = 2; i <= NF; i++) { split($i, kv, "="); r[kv[1]] = kv[2] } }
       /rk_checkpoint stall/ { for (i = 1; i <= NF; i++) if ($i == "=") s = $(i + 1) }
       END { if (!r["persist_s"] || !r["raw_s"]) exit 1
             sub(/x$/, "", s); printf "%s %s %.2f %s %s\n", r["persist_s"], r["raw_s"], r["raw_s"] / r["persist_s"], s,
                                      ("snap_x" in r) ? r["snap_x"] : "-" }' "$work/out"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "bench/ckpt.sh A/B: old $against, new $build, $pairs pairs alternated, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for mib in $sizes; do
  : > "$work/old" && : > "$work/new"
  for ((p = 1; p <= pairs; p++)); do
    order="old new"
    ((p % 2 == 0)) && order="new old"
    for side in $order; do
      b=$build
      [[ $side == old ]] && b=$against
      r=$(one "$b" "$mib") || { echo "ckpt: the $side build's bench_ckpt failed" >&2; exit 1; }
      echo "$r" >> "$work/$side"
      read -r ps rs ratio stall snap <<< "$r"
      printf "  %4d MiB pair %d %-3s  persist %7.3f s  raw %7.3f s  persist/raw %5.2f  stall/memcpy %s  snap/memcpy %s\n" \
        "$mib" "$p" "$side" "$ps" "$rs" "$ratio" "$stall" "$snap"
    done
  done
  for side in old new; do
    snaps=$(cut -d' ' -f5 "$work/$side" | grep -v '^-$')
    printf "  %4d MiB %-3s median of %d: persist/raw %.2f (runs: %s)  stall/memcpy %.2f (runs: %s)  snap/memcpy %s\n" \
      "$mib" "$side" "$pairs" "$(cut -d' ' -f3 "$work/$side" | median)" "$(cut -d' ' -f3 "$work/$side" | paste -sd' ')" \
      "$(cut -d' ' -f4 "$work/$side" | median)" "$(cut -d' ' -f4 "$work/$side" | paste -sd' ')" \
      "$([[ -n $snaps ]] && median <<< "$snaps" || echo -)"
  done
done
