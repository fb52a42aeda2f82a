#!/usr/bin/python3
"""bench/ring_gloo.py - the peer of bench_ring: torch.distributed's gloo allreduce (f32 sum,
in place) on loopback, N processes, the same sizes. Prints one line per size:
  gloo ranks N bytes B us U GBs G
with U the median over iterations of the slowest rank's time and G the bus bandwidth
2(N-1)/N * B / U. Run with Debian's /usr/bin/python3 (python3-torch).
  ring_gloo.py N [MAX_BYTES]"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, n, maxb, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    b = 4096
    while b <= maxb:
        t = torch.ones(b // 4, dtype=torch.float32)
        iters = 200 if b <= 1 << 20 else 20 if b <= 16 << 20 else 5
        for _ in range(2):
            dist.all_reduce(t)
        times = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        tt = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        med = float(tt.sort().values[iters // 2])
        if rank == 0:
            bus = 2.0 * (n - 1) / n * b / 1e9 / med
            print(f"gloo ranks {n} bytes {b} us {med * 1e6:.1f} GBs {bus:.3f}", flush=True)
        b *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1])
    maxb = int(sys.argv[2]) if len(sys.argv) > 2 else 256 << 20
    port = 29500 + (os.getpid() % 2000)
    mp.spawn(worker, args=(n, maxb, port), nprocs=n, join=True)
