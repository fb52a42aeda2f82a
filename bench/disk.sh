#!/usr/bin/env bash
# bench/disk.sh [--dir DIR] [--pairs N] [--matrix-rounds M] [--against OLD_BUILD] [--passes P] BUILD -
# the checkpoint directory's disk measured as fio would, then the write path against it.
#
# 1. The disk (bench/bench_disk matrix): 1 GiB written to a file fallocated first (fio's
#    default), block size {1,4,16 MiB} x queue depth {1,8,32} x {O_DIRECT, buffered}
#    through io_uring, each ending in fdatasync (fio's end_fsync=1; the time runs from open
#    to its end), then read back cold (echo 3 > /proc/sys/vm/drop_caches before each read:
#    root only, the table says when it could not); the cells' order rotates each round;
#    a table, the best write and the best read, and how the file was made ahead (new,
#    ftruncate, fallocate, overwrite) and dd's buffered way against a leaner one. fio
#    itself is not needed (nor used when installed: the same program measures both).
# 2. The write path (bench/bench_disk persist): 1 GiB in 71 float32 tensors through the
#    public API on one rank, RK_IO=uring and RK_IO=buffered, each persist paired with the
#    best raw write of the same bytes in the same process and round (the faster of
#    O_DIRECT 4 MiB x 32 on a file sized first and pwrite 4 MiB + fdatasync as dd), in
#    the round's rotating order; one process per way (its start, 1 GiB of state and three
#    warm-up checkpoints, costs more than a round), N rounds each (default 5). With
#    --against OLD_BUILD its bench_disk runs each way after the new one, before it in every
#    other pass (--passes P, default 1; RK_BENCH_DISK_IO="uring" for one way; an A/B of two
#    builds: git archive REV | tar -x -C /tmp/old; copy bench/bench_disk.c and
#    bench/raw_uring.h there; make -C /tmp/old BUILD=build build/bench/bench_disk).
# Medians per way: persist/best raw, the stall (rk_checkpoint: the copy into staging) and
# the write after it against the same best raw.
# 3. The restore path (bench/bench_restore): 1 GiB in 71 float32 tensors written once
#    through the public API, then N rounds (--pairs) of: raw cold reads of the shard file
#    (O_DIRECT 4 MiB x 32, buffered 4 MiB x 32 through io_uring, 16 MiB preads as dd; its
#    pages dropped first with POSIX_FADV_DONTNEED), rk_resume in a fresh process cold and
#    warm (the file in the page cache), memcpy of the same bytes, the order rotating each
#    round; cold rk_resume / best raw cold read and warm rk_resume / memcpy per round and
#    their medians; the tensors registered whole (full), then as RK_SHARDED rows (sharded).
#    RK_BENCH_RESTORE="full sharded" picks; with --against OLD_BUILD the old build's
#    rk_resume cold and warm are two more ways of the same rounds (interleaved pairs, the
#    order rotating with the rest; its bench_restore serves as the child: copy
#    bench/bench_restore.c there as for bench_disk).
# The machine's load is printed before and after: this disk slows after a burst and other
# work shares it; compare within one run.
set -u
dir=${RK_CKPT_DIR:-/var/tmp}
pairs=${RK_BENCH_PAIRS:-5}
mrounds=${RK_BENCH_MATRIX_ROUNDS:-1}
mib=${RK_BENCH_DISK_MIB:-1024}
against=${RK_BENCH_AGAINST:-}
passes=${RK_BENCH_PASSES:-1}
ios=${RK_BENCH_DISK_IO:-uring buffered}
restores=${RK_BENCH_RESTORE:-full sharded}
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
    --pairs) pairs=${2:?--pairs needs a count}; shift 2 ;;
    --matrix-rounds) mrounds=${2:?--matrix-rounds needs a count}; shift 2 ;;
    --against) against=${2:?--against needs a build directory}; shift 2 ;;
    --passes) passes=${2:?--passes needs a count}; shift 2 ;;
    -*) echo "usage: bench/disk.sh [--dir DIR] [--pairs N] [--matrix-rounds M] [--against OLD_BUILD] [--passes P] BUILD" >&2; exit 2 ;;
    *) break ;;
  esac
done
build=${1:-build}
for n in "$pairs" "$mrounds" "$mib" "$passes"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "disk: '$n' is not a count" >&2; exit 2; }
done
bin=$build/bench/bench_disk
[[ -x $bin ]] || { echo "disk: $bin not built (make BUILD=$build $bin)" >&2; exit 2; }
[[ -z $against || -x $against/bench/bench_disk ]] || { echo "disk: no $against/bench/bench_disk" >&2; exit 2; }
work=$(mktemp -d "$dir/rk-bench-disk.XXXXXX") || { echo "disk: cannot make a directory under $dir" >&2; exit 2; }
trap 'rm -rf "$work"' EXIT
export RK_JOB_SECRET=${RK_JOB_SECRET:-$(printf '%064d' 1)}
fs=$(findmnt -n -o FSTYPE -T "$work" 2>/dev/null)
dev=$(df --output=source "$work" 2>/dev/null | tail -1)
echo "disk.sh: $work on $dev ($fs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) at start"
[[ $(id -u) == 0 ]] || echo "disk.sh: not root: reads cannot drop the page cache (the table says so)"

if [[ $mrounds -gt 0 ]]; then
  "$bin" matrix "$work" "$mib" "$mrounds" || exit 1
fi
[[ $pairs -gt 0 ]] || exit 0

ways=()
for io in $ios; do
  [[ $io == uring || $io == buffered ]] || { echo "disk: RK_BENCH_DISK_IO: '$io' is not uring or buffered" >&2; exit 2; }
  ways+=("new $io")
  [[ -n $against ]] && ways+=("old $io")
done
nw=${#ways[@]}
echo "persist of $mib MiB in 71 tensors, one rank: one process per way, $pairs rounds each (persist and the"
echo "raw writes of the round in a rotating order; GB/s; ratios to the best raw write of the same round):"
for ((p = 0; p < passes * nw; p++)); do
  j=$((p % nw))
  # every other pass runs each pair of ways old first
  [[ -n $against && $(((p / nw) % 2)) == 1 ]] && j=$((j ^ 1))
  w=${ways[$j]}
  b=$build
  [[ $w == old* ]] && b=$against
  rm -rf "$work/run" && mkdir "$work/run" || exit 1
  if ! RK_IO=${w#* } "$b/bench/bench_disk" persist "$work/run" "$mib" "$pairs" > "$work/out" 2>&1; then
    sed 's/^/  /' "$work/out" >&2
    echo "disk: $w failed" >&2
    exit 1
  fi
  echo "  $w ($b):"
  grep -E '^  (round|median)' "$work/out" | sed 's/^/  /'
done

for kind in $restores; do
  [[ $kind == full || $kind == sharded ]] || { echo "disk: RK_BENCH_RESTORE: '$kind' is not full or sharded" >&2; exit 2; }
  for b in "$build" ${against:+"$against"}; do
    [[ -x $b/bench/bench_restore ]] || { echo "disk: no $b/bench/bench_restore" >&2; exit 2; }
  done
  rm -rf "$work/run" && mkdir "$work/run" || exit 1
  if ! "$build/bench/bench_restore" "$work/run" "$mib" "$pairs" 71 "$kind" \
       ${against:+"$against/bench/bench_restore"} > "$work/out" 2>&1; then
    sed 's/^/  /' "$work/out" >&2
    echo "disk: restore ($kind) failed" >&2
    exit 1
  fi
  echo "  restore, $kind ($build${against:+, old: $against}):"
  grep -E '^(restore|  round|  median)' "$work/out" | sed 's/^/  /'
done
echo "disk.sh: load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
