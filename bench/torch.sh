#!/usr/bin/env bash
# bench/torch.sh BUILD - the Python binding against plain PyTorch: per-step overhead of
# the training loop (1 rank), a 1 GiB state dict checkpointed through rekindle vs
# torch.save + fsync (and torch.distributed.checkpoint where the installed torch has it),
# and a DDP step whose gradients go through rekindle.allreduce_hook vs DDP over gloo.
# RK_BENCH_TORCH_GIB (default 1), RK_BENCH_TORCH_REPS (default 5).
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
"$py" -c 'import torch' 2>/dev/null || { echo "  skipped: $py cannot import torch (python3-torch)"; exit 0; }
work=$(mktemp -d "${RK_BENCH_TMP:-/var/tmp}/rk-bench-torch.XXXXXX") || { echo "torch: cannot make a work directory under ${RK_BENCH_TMP:-/var/tmp}" >&2; exit 2; }
trap 'rm -rf "$work"' EXIT
export RK_JOB_SECRET=${RK_JOB_SECRET:-$(printf '%064d' 1)}
export REKINDLE_LIB=$build/lib/librekindle.so.1
"$py" "$here/torch_bench.py" "$work" --gib "${RK_BENCH_TORCH_GIB:-1}" --steps 200 \
  --reps "${RK_BENCH_TORCH_REPS:-5}" 2>&1 | grep -v '^\[rekindle' || exit 1
echo "DDP step (forward + backward + gradient averaging), median of the slowest rank:"
port=$((29500 + RANDOM % 1000))
for n in 2 4; do
  for mode in rekindle gloo; do
    mpirun --allow-run-as-root --oversubscribe -n "$n" --mca btl self,vader,tcp \
      "$py" "$here/torch_ddp.py" "$mode" "$port" 2>&1 | grep '^ddp' || exit 1
    port=$((port + 1))
  done
done
