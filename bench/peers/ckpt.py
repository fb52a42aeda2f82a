"""bench/peers/ckpt.py - one checkpoint of a replicated state dict (16 float32 tensors, G
GiB in all) by 2 ranks, and its restore into zeroed tensors in a new job, by one method.
Run by bench/peers/run, each method under its own launcher, as its documentation has it:

    rekindle run -n 2 -- python ckpt.py rekindle DIR G      rk.checkpoint() + rk.wait()
    rekindle run -n 2 -- python ckpt.py rekindle-buffered DIR G
                                                          the same with io="buffered" (RK_IO:
                                                          page-cache writes + fsync instead
                                                          of O_DIRECT through io_uring)
    rekindle run -n 2 -- python ckpt.py rekindle-inplace DIR G
                                                          the same as rekindle, restored with
                                                          restore="inplace" (RK_RESTORE:
                                                          straight into the tensors)
    rekindle run -n 2 -- python ckpt.py rekindle-against DIR G
                                                          rekindle, run by another build
                                                          (bench/peers/run RK_PEERS_AGAINST)
    torchrun --standalone --nproc-per-node 2 ckpt.py M DIR G
        M = dcp-save        torch.distributed.checkpoint.save
            rekindle-dcp    torch.distributed.checkpoint.save with rekindle.dcp.Writer
                            (Rekindle's checkpoint through DCP's planner; restore:
                            dcp.load with rekindle.dcp.Reader)
            dcp-async       torch.distributed.checkpoint.async_save (its default stager)
            rekindle-dcp-async
                            async_save with rekindle.dcp.Writer (its default stager;
                            restore: dcp.load with rekindle.dcp.Reader)
            dcp-async-pin   async_save with DefaultStager(StagingOptions()): pinned and
                            shared memory, staging in the background, non-blocking
                            copies (its defaults), where this torch has them
            dcp-async-bg    the same with what of it runs without an accelerator:
                            staging in the background only
            torch-save      rank 0 torch.save to one file + fsync of file and directory,
                            the other rank waits at a barrier; restore: torch.load on
                            every rank, copied into the state dict
    ... ckpt.py METHOD-restore DIR G   the restore of what METHOD wrote, in a new job

Each method saves twice and the second save is measured, as in a training loop whose
first checkpoint has passed (Rekindle's staging memory is allocated then; DCP's default
stager allocates anew every time). The rekindle-dcp methods save both into the same
directory, with the Writer's keep=1: the second's retention removes the first, as in a
loop (DCP's own storage deletes nothing: the others' first save is removed before the
second, unmeasured). Every rank is measured between barriers; rank 0
prints the slowest rank's times:
    RESULT METHOD stall=S durable=D         the training stall (the call returns) and
                                            the time until the checkpoint is on disk
    RESULT METHOD restore=R ok=1            restored and every byte checked
    UNAVAILABLE METHOD <the error>          this torch cannot do it here
Before a restore the page cache of the checkpoint's files is dropped (posix_fadvise
DONTNEED: they were fsynced, so it holds clean pages only), so every reader reads disk.
"""
import os
import shutil
import sys
import time

import torch

METHOD, DIR, GIB = sys.argv[1], sys.argv[2], float(sys.argv[3])
RESTORE = METHOD.endswith("-restore")
BASE = METHOD[:-len("-restore")] if RESTORE else METHOD
N = 16
PER = int(GIB * (1 << 30)) // N // 4
torch.set_num_threads(1)


def filled(i, t):
    """Tensor i's bytes: (j mod 2^20) + 2^20 i at element j (exact in float32)."""
    return torch.arange(PER, out=t, dtype=torch.float32).remainder_(1 << 20).add_(float(i << 20))


def state(fill):
    out = {}
    for i in range(N):
        t = torch.zeros(PER, dtype=torch.float32)
        out["layer%02d.weight" % i] = filled(i, t) if fill else t
    return out


def check(sd):
    want = torch.empty(PER, dtype=torch.float32)
    return all(torch.equal(sd["layer%02d.weight" % i], filled(i, want)) for i in range(N))


def evict(root):
    for d, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


def rekindle_job():
    sys.path.insert(0, PACKAGE)
    import rekindle
    root = os.path.join(DIR, "rekindle")
    io = "buffered" if BASE == "rekindle-buffered" else "auto"
    restore = "inplace" if BASE == "rekindle-inplace" else "staged"
    with rekindle.init(ckpt_dir=root, ckpt_every=0, keep=1, io=io, restore=restore) as rk:
        if RESTORE and rk.rank == 0:
            evict(root)
        sd = state(not RESTORE)
        for name, t in sd.items():
            rk.register(name, t)
        if not RESTORE:
            rk.resume()
            rk.checkpoint()  # the first: allocates the staging memory
            rk.wait()
            rk.step_done(0)
        sync = torch.zeros(2, dtype=torch.float64)
        rk.allreduce(sync, "max")  # a barrier
        t0 = time.perf_counter()
        if RESTORE:
            rk.resume()
            times = [time.perf_counter() - t0, float(not check(sd))]
        else:
            rk.checkpoint()
            t1 = time.perf_counter()
            rk.wait()
            times = [t1 - t0, time.perf_counter() - t0]
        sync = torch.tensor(times, dtype=torch.float64)
        rk.allreduce(sync, "max")
        if rk.rank == 0:
            report(sync.tolist())


def report(v):
    if RESTORE:
        print("RESULT %s restore=%.4f ok=%d" % (BASE, v[0], 1 - int(v[1])), flush=True)
    else:
        print("RESULT %s stall=%.4f durable=%.4f" % (BASE, v[0], v[1]), flush=True)


def save_once(method, root, sd, kwargs, rank):
    """One save by a torch method, durable when it returns; returns the time at which
    training could have gone on (the stall's end)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    if method == "torch-save":
        if rank == 0:
            os.makedirs(root, exist_ok=True)
            with open(os.path.join(root, "state.pt"), "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())
            fsync_path(root)
        dist.barrier()
        return time.perf_counter()
    if method == "dcp-save":
        dcp.save(sd, checkpoint_id=root)
        return time.perf_counter()
    if method.startswith("rekindle-dcp"):
        sys.path.insert(0, PACKAGE)
        import rekindle.dcp
        kwargs = dict(kwargs, storage_writer=rekindle.dcp.Writer(root, keep=1))
        if method == "rekindle-dcp":
            dcp.save(sd, **kwargs)
            return time.perf_counter()
    else:
        kwargs = dict(kwargs, checkpoint_id=root)
    save = dcp.async_save(sd, **kwargs)
    t1 = time.perf_counter()
    # With background staging the call returns an AsyncSaveResponse: staging, then upload.
    upload = getattr(save, "upload_completion", save)
    staging = getattr(save, "staging_completion", None)
    if staging is not None:
        staging.result()
        t1 = time.perf_counter()  # the state may not be changed before staging ends
    upload.result()
    return t1


def torch_job():
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = os.path.join(DIR, BASE)
    if RESTORE and rank == 0:
        evict(root)
    sd = state(not RESTORE)
    save, kwargs = None, {}
    if BASE in ("dcp-async-pin", "dcp-async-bg") and not RESTORE:
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            full = BASE == "dcp-async-pin"
            kwargs["async_stager"] = DefaultStager(StagingOptions(use_pinned_memory=full, use_shared_memory=full,
                                                                  use_async_staging=True,
                                                                  use_non_blocking_copy=full))
        except Exception as e:  # noqa: BLE001 - reported as it is
            if rank == 0:
                print("UNAVAILABLE %s %s: %s" % (BASE, type(e).__name__, str(e).splitlines()[0][:300]), flush=True)
            dist.destroy_process_group()
            return
    try:
        if not RESTORE and BASE.startswith("rekindle-dcp"):
            # a loop's first checkpoint, in the same directory: the measured save is its
            # second, whose retention (keep=1) removes the first, as in a training loop
            save_once(BASE, root, sd, kwargs, rank)
        elif not RESTORE:
            save_once(BASE, os.path.join(root, "first"), sd, kwargs, rank)
            shutil.rmtree(os.path.join(root, "first"), ignore_errors=True)
        dist.barrier()
        t0 = time.perf_counter()
        if RESTORE and BASE == "torch-save":
            loaded = torch.load(os.path.join(root, "state.pt"), map_location="cpu", weights_only=True)
            for k, t in sd.items():
                t.copy_(loaded[k])
            del loaded
            times = [time.perf_counter() - t0, float(not check(sd))]
        elif RESTORE and BASE.startswith("rekindle-dcp"):
            sys.path.insert(0, PACKAGE)
            import rekindle.dcp
            dcp.load(sd, storage_reader=rekindle.dcp.Reader(root))
            times = [time.perf_counter() - t0, float(not check(sd))]
        elif RESTORE:
            dcp.load(sd, checkpoint_id=root)
            times = [time.perf_counter() - t0, float(not check(sd))]
        else:
            t1 = save_once(BASE, root, sd, kwargs, rank)
            times = [t1 - t0, time.perf_counter() - t0]
    except Exception as e:  # noqa: BLE001 - a peer that cannot do it here says why
        if rank == 0:
            print("UNAVAILABLE %s %s: %s" % (METHOD, type(e).__name__, str(e).splitlines()[0][:300]), flush=True)
        os._exit(0)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        report(t.tolist())
    dist.destroy_process_group()


rekindle_job() if BASE in ("rekindle", "rekindle-buffered", "rekindle-inplace", "rekindle-against") else torch_job()
