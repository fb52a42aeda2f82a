#!/usr/bin/python3
"""bench/io_peers.py - the h5py peer of bench/bench_io.c (run with Debian's /usr/bin/python3,
which has h5py and numpy).

  io_peers.py write FILE SIZES   writes one float32 dataset t000, t001, ... per line of SIZES
                                 (bytes), the same layout bench_io writes, then os.fsync;
                                 prints the seconds from h5py.File() to the end of the fsync.
"""
import os
import sys
import time

import h5py
import numpy as np


def write(path, sizes_file):
    with open(sizes_file) as f:
        sizes = [int(line) for line in f if line.strip()]
    rng = np.random.default_rng(12345)
    arrays = [rng.random(n // 4, dtype=np.float32) for n in sizes]  # made before the clock starts
    t0 = time.monotonic()
    with h5py.File(path, "w") as h:
        for k, a in enumerate(arrays):
            h.create_dataset("t%03d" % k, data=a)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    print("%.6f" % (time.monotonic() - t0))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "write":
        sys.exit("usage: io_peers.py write FILE SIZES")
    write(sys.argv[2], sys.argv[3])
