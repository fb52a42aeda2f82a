#!/usr/bin/env bash
# bench/ckpt.sh BUILD - the checkpoint engine against raw O_DIRECT, memcpy, HDF5 sec2 (h5py)
# and torch.save+fsync, 1 GiB and 4 GiB (RK_BENCH_CKPT_MIB="1024 4096" to change).
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
work=$(mktemp -d "${RK_BENCH_TMP:-/var/tmp}/rk-bench-ckpt.XXXXXX") || { echo "ckpt: cannot make a work directory under ${RK_BENCH_TMP:-/var/tmp}" >&2; exit 2; }
trap 'rm -rf "$work"' EXIT
export RK_JOB_SECRET=${RK_JOB_SECRET:-$(printf '%064d' 1)}
for mib in ${RK_BENCH_CKPT_MIB:-1024 4096}; do
  rm -rf "$work"/*
  "$build/bench/bench_ckpt" "$work" "$mib" 71 | tee "$work/out" || exit 1
  persist=$(sed -n 's/^RESULT persist_s=\([0-9.]*\).*/\1/p' "$work/out")
  "$py" "$here/ckpt_peers.py" "$work" "$mib" "$persist" || echo "  (python peers not available)"
done
