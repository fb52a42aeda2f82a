#!/usr/bin/python3
"""Peers of the checkpoint engine, same bytes, same run: h5py (HDF5 sec2) and torch.save,
each ending in fsync. Usage: ckpt_peers.py WORKDIR MIB PERSIST_SECONDS"""
import os, sys, time
import numpy as np
import h5py

work, mib, persist = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
n = 71
per = (mib << 20) // n // 4
state = [np.random.default_rng(i).random(per, dtype=np.float32) for i in range(n)]
gb = n * per * 4 / 1e9

def fsync(path):
    fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)

t0 = time.monotonic()
with h5py.File(os.path.join(work, "h5py.h5"), "w") as f:
    for i, a in enumerate(state):
        f.create_dataset("layer%03d/w" % i, data=a)
fsync(os.path.join(work, "h5py.h5"))
t = time.monotonic() - t0
print("  h5py (sec2) + fsync       %7.2f GB/s; rekindle is %.2fx faster" % (gb / t, t / persist))
os.unlink(os.path.join(work, "h5py.h5"))
try:
    import torch
except ImportError:
    print("  torch.save: python3-torch not installed")
    sys.exit(0)
ts = {"layer%03d/w" % i: torch.from_numpy(a) for i, a in enumerate(state)}
t0 = time.monotonic()
torch.save(ts, os.path.join(work, "torch.pt"))
fsync(os.path.join(work, "torch.pt"))
t = time.monotonic() - t0
print("  torch.save + fsync        %7.2f GB/s; rekindle is %.2fx faster (goal >= 3)" % (gb / t, t / persist))
os.unlink(os.path.join(work, "torch.pt"))
