#!/bin/sh
# bench/walk.sh [--zero] [BUILD] - how often a recovery's walk through the code moves between
# files: the library built with -finstrument-functions into BUILD (default build/walk), a
# 3-worker rk-train job whose rank 2 crashes in its 20th rk_allreduce (RK_FAULT), the
# survivors' calls recorded (bench/walk/trace.c, preloaded), and bench/walk/count.py's count of
# the moves between files from entering rec_recover to leaving it (docs/BENCHMARKS.md,
# "The walk of a recovery"). --zero: Adam's moments sharded (the partnered rollback).
# RK_WALK_SEQ=1 prints every move.
set -eu
zero=
[ "${1:-}" = --zero ] && { zero=--zero; shift; }
build=${1:-build/walk}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
make -s -j2 BUILD="$build" CFLAGS='-O0 -g -finstrument-functions' "$build/bin/rk-train" "$build/bin/rekindle" >/dev/null
cc -O2 -g -shared -fPIC -o "$build/walk_trace.so" bench/walk/trace.c -ldl -lpthread
tmp=$(mktemp -d)
[ -n "${RK_WALK_KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT; echo "walk.sh: $tmp" >&2
RK_CKPT_DIR="$tmp/ckpt" RK_CKPT_EVERY=10 RK_SNAPSHOT_EVERY=1 RK_TIMEOUT_MS=2000 RK_RUN_DIR="$tmp/run" \
LD_LIBRARY_PATH="$top/$build/lib" RK_WALK_OUT="$tmp/walk" RK_WALK_ZERO="$zero" RK_WALK_BIN="$top/$build/bin/rk-train" \
RK_WALK_PRELOAD="$top/$build/walk_trace.so" "$build/bin/rekindle" run -n 3 -- sh -c \
    'export LD_PRELOAD=$RK_WALK_PRELOAD RK_WALK_OUT=$RK_WALK_OUT.r$OMPI_COMM_WORLD_RANK; [ "$OMPI_COMM_WORLD_RANK" = 2 ] && export RK_FAULT=allreduce@20=crash
     exec "$RK_WALK_BIN" --steps 40 $RK_WALK_ZERO' \
    >"$tmp/out" 2>&1 || true
grep -q "final" "$tmp/out" || { head -50 "$tmp/out" >&2; echo "walk.sh: the job did not end" >&2; exit 1; }
python3 bench/walk/count.py "$tmp"/walk.r0.*
