#!/usr/bin/env bash
# bench/exit_cuda.sh BUILD - where the time between a worker's SIGKILL and its parent's
# waitpid goes, for a CUDA process against a CPU process of the same host memory
# (bench/exit_probe: the main thread's exit begun, every thread inside its exit - what
# `rekindle run`'s wrapper reports on -, the pipe's end of file, the zombie, waitpid; ms
# from the kill, median and largest of RK_BENCH_EXIT_RUNS runs, default 10). The CUDA child
# is PyTorch with RK_BENCH_EXIT_GIB GiB (default 1) on the device and as much pinned host
# memory; the CPU child the same GiB of host memory. Without a Python whose torch sees a
# CUDA device it runs the CPU child alone and says so.
set -u
build=${1:-build}
probe="$build/bench/exit_probe"
runs=${RK_BENCH_EXIT_RUNS:-10}
gib=${RK_BENCH_EXIT_GIB:-1}
[[ -x $probe ]] || { echo "exit_cuda: skipped: $probe is not built"; exit 0; }
cpu_py=$(command -v python3 || echo /usr/bin/python3)
"$probe" --runs "$runs" -- "$cpu_py" -c "
import os, time
x = bytearray($gib << 30)
os.write(3, b'r'); time.sleep(600)" | sed 's/^/exit_cuda: cpu: /' | grep -v ': run '
if ! py=$("$(dirname "$0")/../scripts/cuda-python"); then
  echo "exit_cuda: cuda: skipped: no Python whose torch sees a CUDA device"
  exit 0
fi
"$probe" --runs "$runs" -- "$py" -c "
import os, time, torch
d = torch.empty($gib << 28, device='cuda')
h = torch.empty($gib << 28).pin_memory()
d.fill_(1.0); h.copy_(d, non_blocking=True); torch.cuda.synchronize()
os.write(3, b'r'); time.sleep(600)" | sed 's/^/exit_cuda: cuda: /'
