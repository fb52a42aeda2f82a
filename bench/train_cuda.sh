#!/usr/bin/env bash
# bench/train_cuda.sh BUILD - rk-train --device cuda against its peer, --device cpu, on one
# process: the wall time of the same run (256 hidden units, 3 layers, batch 256, 10 steps),
# the ratio, and whether the two printed the same final line (they must: docs/RK-TRAIN.md).
# Where --device cuda cannot run (no GPU, or a build without CUDA) it says so and exits 0.
set -uo pipefail
build=${1:-build}
bin="$build/bin/rk-train"
args=(--steps 10 --hidden 256 --layers 3 --batch 256 --seed 3)
unset RK_CKPT_DIR
probe=$("$bin" --steps 0 --device cuda 2>&1)
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "train_cuda: skipped: ${probe##*rk-train: }"
  exit 0
fi
run() { # prints seconds, then the final line
  local t0 t1 out
  t0=$(date +%s.%N)
  out=$("$bin" --device "$1" "${args[@]}" 2>&1) || { echo "train_cuda: --device $1 failed: $out" >&2; return 1; }
  t1=$(date +%s.%N)
  echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}') $(grep '^final ' <<<"$out")"
}
cpu=$(run cpu) && cuda=$(run cuda) || exit 1
tc=${cpu%% *} tg=${cuda%% *}
same=$([[ ${cpu#* } == "${cuda#* }" ]] && echo "same final line" || echo "DIFFERENT final lines")
printf 'train_cuda: %s: cpu %.2f s, cuda %.2f s, cuda/cpu speed %.1fx, %s\n' "${args[*]}" "$tc" "$tg" \
  "$(awk -v a="$tc" -v b="$tg" 'BEGIN {print a / b}')" "$same"
[[ $same == "same final line" ]]
