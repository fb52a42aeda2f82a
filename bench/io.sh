#!/usr/bin/env bash
# bench/io.sh BUILD - the checkpoint I/O path (formats/): the HDF5 driver over io_uring +
# O_DIRECT against a raw O_DIRECT write of the same bytes (the physical limit, same run),
# HDF5's default driver and h5py; and the driver's read against a raw O_DIRECT read.
# 1 GiB in 71 float32 datasets; with RK_BENCH_BIG=1 also 4 GiB in 311 datasets.
# Files go to $RK_BENCH_DIR (default: a new directory under BUILD) and are deleted.
set -u
build=${1:?usage: bench/io.sh BUILD}
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/bench/bench_io
[[ -x $bin ]] || { echo "io.sh: $bin not built"; exit 1; }
dir=$(mktemp -d "${RK_BENCH_DIR:-$build}/bench-io.XXXXXX") || { echo "io: cannot make a directory under ${RK_BENCH_DIR:-$build}" >&2; exit 2; }
trap 'rm -rf "$dir"' EXIT
peer=()
if /usr/bin/python3 -c 'import h5py, numpy' 2>/dev/null; then
  peer=(--python /usr/bin/python3 --peer "$here/io_peers.py")
else
  echo "io.sh: /usr/bin/python3 has no h5py: the h5py peer is left out"
fi
status=0
"$bin" --dir "$dir" --gib 1 --datasets 71 --rounds "${RK_BENCH_ROUNDS:-5}" "${peer[@]}" || status=1
if [[ ${RK_BENCH_BIG:-0} == 1 ]]; then
  "$bin" --dir "$dir" --gib 4 --datasets 311 --rounds "${RK_BENCH_ROUNDS:-3}" "${peer[@]}" || status=1
fi
exit $status
