#!/usr/bin/env bash
# bench/step_cuda.sh BUILD - the cost of a snapshot at every step on a GPU (bench/snapshot.py
# --device cuda): rk-train --device cuda at 512 MiB and 2 GiB of parameters and Adam state
# on one rank, then examples/torch_train.py --device cuda (--hidden 1024), each with
# RK_SNAPSHOT_EVERY=1 against 0 and no disk checkpoint: the time a step with and without,
# their ratio (goal <= 1.02), and the time training waited for the device-to-host copy.
# RK_BENCH_STEP_CUDA_SIZES (default "512,2048"), RK_BENCH_STEP_CUDA_PAIRS (2). Where
# --device cuda cannot run it says so and exits 0.
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
probe=$(RK_CKPT_DIR= "$build/bin/rk-train" --steps 0 --device cuda 2>&1)
if [[ $? -ne 0 ]]; then
  echo "step_cuda: skipped: ${probe##*rk-train: }"
  exit 0
fi
pairs=${RK_BENCH_STEP_CUDA_PAIRS:-2}
python3 "$here/snapshot.py" "$build" --device cuda --ranks 1 --sizes "${RK_BENCH_STEP_CUDA_SIZES:-512,2048}" \
  --steps 10 --pairs "$pairs" || exit 1
if py=$("$here/../scripts/cuda-python"); then
  RK_TEST_PYTHON=$py python3 "$here/snapshot.py" "$build" --device cuda --ranks 1 --torch 1024 --steps 20 \
    --pairs "$pairs" || exit 1
else
  echo "step_cuda: torch_train.py skipped: no Python whose torch sees a CUDA device"
fi
