"""tests/py/dcp_read_check.py BUILD WORK - how rekindle.dcp.Reader reads a replicated state
dict that every rank of one machine loads (2 workers started here: gloo, a FileStore):

  1. dcp.save through Writer of 4 float32 tensors of 4 MiB, an int64 one and a non-tensor
     value (DCP's bytes);
  2. the checkpoint's pages dropped from the page cache (posix_fadvise DONTNEED), then
     dcp.load through Reader(shared=False): every rank reads every byte from the disk
     (O_DIRECT), the ranks' disk reads (/proc/self/io read_bytes) summing to about twice
     the data;
  3. dropped again, dcp.load through Reader(): the coordinator sees both ranks of this
     machine read every tensor, so each rank's batch goes through the page cache
     (RK_READ_SHARED): the disk is read once for the machine, the sum under 1.5 times the
     data. One destination is a transposed view (not contiguous): read into a tensor of
     the Reader's own and copied;
  every value equal to the saved one after each load.
Where the disk's reads are not seen (/proc/self/io missing, a file system without
O_DIRECT such as tmpfs: step 2 sums under 1.5 times the data), the bound of step 3 is not
checked and that is said. Prints "dcp_read_check: ok" at the end.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BUILD, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
CKPT = os.path.join(WORK, "ckpt")
N, PER = 4, 1 << 20  # float32 elements of each tensor: 4 MiB
DATA = N * PER * 4 + 64 * 8


def state(fill):
    sd = {"w%d" % i: torch.arange(PER, dtype=torch.float32).add_(i * PER) if fill else torch.zeros(PER)
          for i in range(N)}
    # stored as (8, 8); its destination is a transposed view of an (8, 8) tensor
    sd["t"] = torch.arange(64, dtype=torch.int64).view(8, 8) if fill else torch.zeros(8, 8, dtype=torch.int64).t()
    sd["meta"] = {"epoch": 3, "name": "dcp_read_check"} if fill else {"epoch": 0, "name": ""}
    return sd


def equal(sd):
    want = state(True)
    return (all(torch.equal(sd[k], want[k]) for k in want if k != "meta") and sd["meta"] == want["meta"])


def drop_pages():
    for d, _, files in os.walk(CKPT):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def disk_read():
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration):
        return None


def load(rank, shared):
    """dcp.load of the state through Reader(shared=...), pages dropped first: whether every
    value came back, and the bytes both ranks read from the disk (None: not seen here)."""
    import torch.distributed.checkpoint as dcp
    import rekindle.dcp
    if rank == 0:
        drop_pages()
    dist.barrier()
    sd = state(False)
    before = disk_read()
    dcp.load(sd, storage_reader=rekindle.dcp.Reader(CKPT, shared=shared))
    after = disk_read()
    n = torch.tensor([-1.0 if before is None else float(after - before)], dtype=torch.float64)
    dist.all_reduce(n)
    return equal(sd), None if before is None else n.item()


def worker(rank, world):
    import torch.distributed.checkpoint as dcp
    import rekindle.dcp
    store = dist.FileStore(os.path.join(WORK, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    dcp.save(state(True), storage_writer=rekindle.dcp.Writer(CKPT))
    ok, direct = load(rank, False)
    if not ok:
        raise SystemExit("dcp_read_check: Reader(shared=False): the state differs after the load")
    ok, shared = load(rank, None)
    if not ok:
        raise SystemExit("dcp_read_check: Reader(): the state differs after the load")
    if rank == 0:
        print("dcp_read_check: disk reads of both ranks, data %d bytes: O_DIRECT %s, shared %s"
              % (DATA, direct, shared), flush=True)
        if direct is None or direct < 1.5 * DATA:
            print("dcp_read_check: this file system's reads are not seen from /proc/self/io: bound not checked")
        elif shared >= 1.5 * DATA:
            raise SystemExit("dcp_read_check: the 2 ranks read %d bytes from the disk through Reader(), %.2f "
                             "times the data: each read it for itself" % (shared, shared / DATA))
    dist.barrier()
    dist.destroy_process_group()


def main():
    os.makedirs(WORK, exist_ok=True)
    mp.spawn(worker, args=(2,), nprocs=2)
    print("dcp_read_check: ok")


if __name__ == "__main__":
    main()
