#!/usr/bin/env bash
# bench/dcp_cuda.sh BUILD - torch.distributed.checkpoint.async_save against Rekindle, the
# same 1 and 4 GiB of CUDA tensors on the same GPU in the same process (bench/dcp_cuda.py,
# one process a size): DCP's blocking time and time until the state is free against the
# time training waits inside Rekindle's step_done, and until its copy is done; then, in a new
# process with the page cache dropped where it may be, dcp.load against Rekindle's resume
# into new tensors (bench/dcp_cuda.py, "restore"). The last line
# is the ratio per size. RK_BENCH_DCP_CUDA_SIZES="1G 4G" to change the sizes; the whole
# stays within RK_BENCH_BUDGET_S (90) seconds: a size is not started with less than 15 s +
# 5 s a GiB left (reported NOT RUN), and the script leaves out repetitions that would not
# fit; stopped from outside (SIGTERM), it still prints its last line. Python: the first of $RK_TEST_PYTHON,
# python3, /usr/bin/python3 whose torch sees a CUDA device; with none (or a build without
# the library) it says so and exits 0. RK_BENCH_DCP_CUDA_CPU=1: a dry run on CPU tensors
# with the first of them that has torch (--cpu), where there is no GPU.
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
lib="$build/lib/librekindle.so.1"
sizes=${RK_BENCH_DCP_CUDA_SIZES:-1G 4G}
budget=${RK_BENCH_BUDGET_S:-90}
start=$SECONDS
if [[ ! -e $lib ]]; then
  echo "dcp_cuda: skipped: $lib is not built"
  exit 0
fi
cpu=() probe=
[[ ${RK_BENCH_DCP_CUDA_CPU:-0} == 1 ]] && probe='import torch.distributed.checkpoint' cpu=(--cpu)
if ! py=$("$(dirname "$0")/../scripts/cuda-python" ${probe:+"$probe"}); then
  echo "dcp_cuda: skipped: no Python whose torch sees a CUDA device (tried ${RK_TEST_PYTHON:+$RK_TEST_PYTHON, }/usr/bin/python3, python3)"
  exit 0
fi
REKINDLE_LIB=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}" REKINDLE_LIB
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset RK_CKPT_DIR RK_CKPT_EVERY RK_SNAPSHOT_EVERY
out=$(mktemp) && work=$(mktemp -d "${TMPDIR:-/tmp}/rk-bench-dcp.XXXXXX") || exit 1
trap 'rm -rf "$out" "$work"' EXIT
status=0 summary=() current=
finish() { (IFS=';'; echo "dcp_cuda: rekindle's stall / dcp.async_save's blocking time: ${summary[*]}" | sed 's/;/; /g'); }
trap 'summary+=("${current:-?} stopped from outside"); finish; exit 1' TERM INT
for sz in $sizes; do
  current=$sz
  left=$((budget - (SECONDS - start)))
  need=$(awk -v s="$sz" 'BEGIN {n = s + 0; print 15 + 5 * ((s ~ /[Mm]/) ? int(n / 1024) : n)}')
  if [[ $left -lt $need ]]; then
    echo "dcp_cuda: $sz: NOT RUN: $left s of the ${budget} s budget left, it needs $need"
    summary+=("$sz not run")
    status=1
    continue
  fi
  timeout -k 5 "$left" "$py" "$here/dcp_cuda.py" "$sz" "${cpu[@]}" --dir "$work/$sz" --budget $((left - 5)) 2>&1 | tee "$out" | grep -v '^RESULT '
  rc=${PIPESTATUS[0]}
  [[ $rc -eq 77 ]] && exit 0 # no device after all: its line said why
  r=$(sed -n 's/^RESULT .* rk_stall_ms=\([0-9.]*\) rk_copy_ms=\([0-9.]*\) .* dcp_block_ms=\([0-9.na]*\) dcp_free_ms=\([0-9.na]*\) .*/\1 \2 \3 \4/p' "$out")
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "dcp_cuda: $sz: FAILED: still running after $left s (killed)"
  elif [[ $rc -ne 0 ]]; then
    echo "dcp_cuda: $sz: FAILED (exit $rc)"
  fi
  [[ $rc -eq 0 ]] || status=1
  if [[ -z $r ]]; then
    summary+=("$sz failed")
    continue
  fi
  read -r st cp blk free <<<"$r"
  if [[ $blk == na ]]; then
    summary+=("$sz: rekindle stall $st ms, copy done $cp ms, no dcp figure")
  else
    summary+=("$(awk -v st="$st" -v cp="$cp" -v b="$blk" -v f="$free" -v s="$sz" 'BEGIN {
      printf "%s %.4fx (%.2f vs %.1f ms), until the state is free %.3fx (%.1f vs %.1f ms)", s, st / b, st, b, cp / f, cp, f }')")
  fi
done
finish
exit $status
