#!/usr/bin/env bash
# bench/recover_cuda.sh BUILD - bench/recover.py on GPU ranks: four rk-train --device cuda
# workers sharing the GPU (gradients through NCCL), one SIGKILLed per run; kill ->
# peer_dead / ring_rebuilt / resumed and steps lost for the in-memory rollback, the disk
# rollback and a full relaunch. Fewer runs than the CPU benchmark (5, 3, 2: RK_BENCH_KILLS,
# RK_BENCH_DISK, RK_BENCH_RELAUNCH override) and shorter ones (200 steps of a 64-unit
# model: four ranks on one GPU talk through NCCL's sockets, ~10 ms a step), so that it
# fits scripts/gpu-check's 100 s.
# Where --device cuda cannot run (no GPU, or a build without CUDA) it says so and exits 0.
set -uo pipefail
build=${1:-build}
probe=$(RK_CKPT_DIR= "$build/bin/rk-train" --steps 0 --device cuda 2>&1)
if [[ $? -ne 0 ]]; then
  echo "recover_cuda: skipped: ${probe##*rk-train: }"
  exit 0
fi
py=$(command -v python3 || echo /usr/bin/python3)
export RK_BENCH_DEVICE=cuda RK_BENCH_KILLS=${RK_BENCH_KILLS:-5} RK_BENCH_DISK=${RK_BENCH_DISK:-3}
export RK_BENCH_RELAUNCH=${RK_BENCH_RELAUNCH:-2} RK_BENCH_STEPS=${RK_BENCH_STEPS:-200}
export RK_BENCH_HIDDEN=${RK_BENCH_HIDDEN:-64}
exec "$py" "$(dirname "$0")/recover.py" "$build"
