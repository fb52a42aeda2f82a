#!/usr/bin/env python3
"""bench/dcp_cuda.py SIZE [--tensors N] [--reps R] [--dir DIR] [--budget S] [--cpu] [--gloo]

torch.distributed.checkpoint.async_save against Rekindle, the same state on the same GPU in
the same process: SIZE (1G, 4G, 512M) of float32 CUDA tensors in a dict of N (8), as a
model's. Run by bench/dcp_cuda.sh, one process a size (Rekindle's registry lives as long as
its process).

  dcp        async_save(state, checkpoint_id=DIR/dcp) on one process (no_dist where this
             torch has it and unless --gloo, else a gloo group of one), each way this
             torch has:
               default  its default stager (copies to host memory before it returns)
               pinned   DefaultStager(StagingOptions(pinned, async staging, non-blocking
                        copy; not shared memory, which only its process-based saver needs
                        and /dev/shm may be too small for)), kept across saves as its
                        documentation has it
                        (--cpu: "async-staging", neither pinned nor non-blocking)
             per save: the call's return ("blocks"), the end of staging, after which the
             state may change ("state free": the call's return for the default stager),
             and the save's completion ("on disk"); a warm-up, then the best of R
  rekindle   rekindle.init(ckpt_dir=DIR/rk, ckpt_every=0, snapshot_every=1), the same
             tensors registered (DEVICE), two warm-up steps (each maps and pins a generation
             of staging), then R steps: the time inside step_done ("stall": what training
             waits for while the copy overlaps its next passes), and until before_update,
             called at once, returns ("copy done": nothing overlapping); then one checkpoint:
             checkpoint() and wait() (on disk), its bytes read back with rekindle.load and
             compared (sizes up to --verify-max, 1 GiB)
  restore    (in a new process: this one's registry holds the tensors) the page cache
             dropped where this process may (root), then into new tensors of the same
             shapes on the device: dcp.load of one more DCP checkpoint of the same state
             (dcp.save) against rekindle's resume() of its checkpoint, each until the
             tensors are on the device (synchronized), and both compared with the state

Prints one line per way, a RESULT line for the wrapper. --cpu: the same on CPU tensors (a
dry run of every call where there is no GPU). Exit 0 measured; 77 no CUDA device (the line
says why); 1 a step failed (the line says which and why; a failed way of DCP's does not
stop the rest).
"""
import argparse
import atexit
import inspect
import os
import shutil
import sys
import tempfile
import time

T0 = time.monotonic()
LIMIT_S = 100.0  # no single wait longer than this


def say(msg):
    print("dcp_cuda: " + msg, flush=True)


def parse_size(s):
    u = s[-1:].upper()
    if u not in ("G", "M") or not s[:-1].isdigit() or int(s[:-1]) == 0:
        raise argparse.ArgumentTypeError("%r: want 1G, 4G, 512M" % s)
    return int(s[:-1]) << (30 if u == "G" else 20)


def why(e):
    """An exception in one line: its type and the last line of its message."""
    msg = str(e).strip()
    return "%s: %s" % (type(e).__name__, msg.splitlines()[-1][:400] if msg else "")


def label(n):
    return "%d GiB" % (n >> 30) if n % (1 << 30) == 0 else "%d MiB" % (n >> 20)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("size", type=parse_size)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None, help="work directory (default: a new one under $TMPDIR or /tmp)")
    p.add_argument("--budget", type=float, default=100.0, help="seconds: measurements that would start past "
                   "it are left out (said so)")
    p.add_argument("--verify-max", type=parse_size, default=1 << 30)
    p.add_argument("--cpu", action="store_true", help="CPU tensors: a dry run without a GPU")
    p.add_argument("--gloo", action="store_true", help="async_save in a gloo group of one even where no_dist is")
    p.add_argument("--restore", action="store_true", help="(internal) the restore half, from --dir's checkpoints")
    a = p.parse_args()
    size = label(a.size)

    def fail(what, e):
        say("%s: FAILED: %s: %s" % (size, what, why(e)))
        sys.exit(1)

    import torch
    if a.cpu:
        dev = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            say("skipped: torch %s sees no CUDA device" % torch.__version__)
            sys.exit(77)
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def left():
        return a.budget - (time.monotonic() - T0)

    work = a.dir or tempfile.mkdtemp(prefix="rk-bench-dcp.", dir=os.environ.get("TMPDIR") or "/tmp")
    os.makedirs(work, exist_ok=True)
    if not a.dir:  # a directory of its own goes, whatever the end (one given is the caller's)
        atexit.register(shutil.rmtree, work, True)
    per = a.size // a.tensors // 4
    try:
        sd = {}
        for i in range(a.tensors):
            t = torch.empty(per, dtype=torch.float32, device=dev)
            # element j of tensor i: (j mod 2^20) + 2^20 i, exact in float32
            torch.arange(per, out=t).remainder_(1 << 20).add_(float(i << 20))
            sd["layer%02d.weight" % i] = t
        sync()
    except Exception as e:  # noqa: BLE001 - said as it is
        fail("making the state", e)
    if a.restore:
        restore(a, size, sd, dev, sync, fail)
        return
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    say("%s: torch %s, %s, %d float32 tensors of %.1f MiB, in %s" % (size, torch.__version__, name, a.tensors,
                                                                        per * 4 / 2 ** 20, work))
    results = {}

    # ---- torch.distributed.checkpoint.async_save ------------------------------------------
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    kw = {}
    if "no_dist" in inspect.signature(dcp.async_save).parameters and not a.gloo:
        kw["no_dist"] = True
        how = "no_dist=True"
    else:
        try:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        except Exception as e:  # noqa: BLE001
            fail("a gloo process group of one for async_save", e)
        how = "a gloo group of one"
    ways = [("default", None)]
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        gpu = dev.type == "cuda"  # pinning and non-blocking copies need the device (--cpu: not them)
        # A fresh stager for every save: on torch 2.11 + CUDA a second save through one
        # stager failed inside torch ("KeyError: <class 'type'>"), the first one worked.
        ways.append(("pinned" if gpu else "async-staging",
                     lambda: DefaultStager(StagingOptions(use_pinned_memory=gpu, use_shared_memory=False,
                                                          use_async_staging=True, use_non_blocking_copy=gpu))))
    except Exception as e:  # noqa: BLE001 - an older torch: said, not fatal
        say("%s: dcp's stager with async staging unavailable in torch %s: %s" % (size, torch.__version__, why(e)))

    def dcp_once(stager, root):
        """(blocks, state free, on disk) seconds of one async_save."""
        args = dict(kw)
        if stager is not None:
            args["async_stager"] = stager
        sync()
        t0 = time.perf_counter()
        f = dcp.async_save(sd, checkpoint_id=root, **args)
        t1 = time.perf_counter()
        # With async staging the call returns an AsyncSaveResponse: staging, then the upload.
        staging = getattr(f, "staging_completion", None)
        upload = getattr(f, "upload_completion", f)
        if staging is not None:
            staging.result(timeout=LIMIT_S)
        t2 = time.perf_counter()
        upload.result(timeout=LIMIT_S)
        t3 = time.perf_counter()
        shutil.rmtree(root, ignore_errors=True)
        return t1 - t0, t2 - t0, t3 - t0

    dcp_failed = False
    save_s = 0.0  # one save's time: Rekindle's part is kept time for (its checkpoint writes the same bytes)
    for way, make_stager in ways:
        runs, warm = [], None
        stager = None
        try:
            for r in range(a.reps + 1):  # r 0: the warm-up
                if left() < (2.5 if r else 2) * save_s + 10:
                    say("%s: dcp %s: %d of %d saves left out: the %.0f s budget" % (
                        size, way, a.reps + 1 - r, a.reps + 1, a.budget))
                    break
                stager = make_stager() if make_stager else None
                t = time.monotonic()
                one = dcp_once(stager, os.path.join(work, "dcp"))
                save_s = max(save_s, time.monotonic() - t)
                if stager is not None:
                    stager.close()
                    stager = None
                if r > 0:
                    runs.append(one)
                else:
                    warm = one
        except Exception as e:  # noqa: BLE001 - said, with where torch raised it; Rekindle's part still runs
            import traceback
            tb = traceback.extract_tb(e.__traceback__)[-3:]
            say("%s: dcp.async_save (%s stager, %s): FAILED in torch: %s (at %s)" % (
                size, way, how, why(e), "; ".join("%s:%d %s" % (os.path.basename(f.filename), f.lineno, f.name)
                                                 for f in tb)))
            dcp_failed = dcp_failed or way == "default"  # the comparison needs the default way
        finally:
            if stager is not None:
                stager.close()
        if not runs and not warm:
            continue
        b = [min(x[i] for x in runs or [warm]) * 1e3 for i in range(3)]
        results[way] = b
        say("%s: dcp.async_save (%s stager, %s): blocks %.1f ms, state free %.1f ms, on disk %.0f ms (%s)"
            % (size, way, how, b[0], b[1], b[2], "best of %d" % len(runs) if runs else "the warm-up alone"))
    kept = False  # one more DCP checkpoint, kept for the restore
    if left() > 2.5 * save_s + 20:
        try:
            dcp.save(sd, checkpoint_id=os.path.join(work, "dcp-keep"), **kw)
            kept = True
        except Exception as e:  # noqa: BLE001 - said; the restore then has Rekindle's side alone
            say("%s: dcp.save for the restore: FAILED in torch: %s" % (size, why(e)))
    if dist.is_initialized():
        dist.destroy_process_group()

    # ---- Rekindle ---------------------------------------------------------------------------
    rkdir = os.path.join(work, "rk")
    try:
        import rekindle
        rk = rekindle.init(ckpt_dir=rkdir, ckpt_every=0, snapshot_every=1, keep=1)
    except Exception as e:  # noqa: BLE001
        fail("rekindle.init", e)
    try:
        for k, t in sd.items():
            rk.register(k, t)
        step = rk.resume()
        first = []
        for _ in range(2):  # each maps and pins one generation of staging
            sync()
            t0 = time.perf_counter()
            rk.step_done(step)
            rk.before_update()
            first.append(time.perf_counter() - t0)
            step += 1
        stall, copy = [], []
        for _ in range(a.reps):
            sync()
            t0 = time.perf_counter()
            rk.step_done(step)
            t1 = time.perf_counter()
            rk.before_update()
            t2 = time.perf_counter()
            stall.append(t1 - t0)
            copy.append(t2 - t0)
            step += 1
        ck, checked = None, "no checkpoint: the budget"
        if left() > 1.5 * save_s + 5:
            sync()
            t0 = time.perf_counter()
            rk.checkpoint()
            t1 = time.perf_counter()
            rk.before_update()
            t2 = time.perf_counter()
            rk.wait()
            t3 = time.perf_counter()
            ck = [(t1 - t0) * 1e3, (t2 - t0) * 1e3, (t3 - t0) * 1e3]
            checked = "not read back (over %s, or the budget)" % label(a.verify_max)
        if ck and a.size <= a.verify_max and left() > 3 * save_s + 5:
            got = rekindle.load(rkdir)
            bad = [k for k, t in sd.items() if k not in got or not torch.equal(got[k], t.cpu())]
            if bad:
                raise RuntimeError("the checkpoint read back differs from the state in %d tensors (%s)" % (
                    len(bad), ", ".join(bad[:3])))
            checked = "read back and equal"
        rk.finalize()
    except Exception as e:  # noqa: BLE001
        fail("rekindle", e)
    st, cp = min(stall) * 1e3, min(copy) * 1e3
    say("%s: rekindle: step_done %.2f ms, copy done (before_update) %.1f ms (best of %d); first two snapshots (map + "
        "pin a generation each) %.0f + %.0f ms; %s%s"
        % (size, st, cp, a.reps, first[0] * 1e3, first[1] * 1e3, "checkpoint() %.2f ms, copy done %.1f ms, on disk "
           "(wait) %.0f ms, " % tuple(ck) if ck else "", checked))
    d = results.get("default")
    pn = results.get("pinned") or results.get("async-staging")
    if d:
        say("%s: rekindle's stall %.2f ms vs dcp's blocking %.1f ms: %.4fx; until the state is free %.1f vs %.1f ms: "
            "%.3fx%s" % (size, st, d[0], st / d[0], cp, d[1], cp / d[1],
                         "; dcp with async staging: blocks %.1f ms, state free %.1f ms" % (pn[0], pn[1]) if pn else ""))
    print("RESULT size=%s rk_stall_ms=%.3f rk_copy_ms=%.3f rk_disk_ms=%.1f dcp_block_ms=%s dcp_free_ms=%s "
          "dcp_disk_ms=%s dcp_pin_block_ms=%s dcp_pin_free_ms=%s" % (
              size.replace(" GiB", "G").replace(" MiB", "M"), st, cp, ck[2] if ck else -1,
              *("%.3f" % x if x is not None else "na" for x in (
                  d[0] if d else None, d[1] if d else None, d[2] if d else None,
                  pn[0] if pn else None, pn[1] if pn else None))), flush=True)
    if ck and left() > 3 * save_s + 10:
        import subprocess
        cmd = [sys.executable, os.path.abspath(__file__), "%dM" % (a.size >> 20), "--tensors", str(a.tensors),
               "--dir", work, "--restore"] + (["--cpu"] if a.cpu else [])
        try:
            r = subprocess.run(cmd, timeout=max(10.0, left() - 5), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
            sys.stdout.write(r.stdout)
            if r.returncode != 0:
                say("%s: restore: FAILED (exit %d)" % (size, r.returncode))
                dcp_failed = True
        except subprocess.TimeoutExpired:
            say("%s: restore: FAILED: still running at the budget" % size)
            dcp_failed = True
    else:
        say("%s: restore: NOT RUN (%s)" % (size, "no checkpoint" if not ck else "the budget"))
    if dcp_failed:
        sys.exit(1)


def restore(a, size, sd, dev, sync, fail):
    """The restore half (a process of its own): dcp.load against rekindle's resume, into new
    tensors on the device, each compared with the state sd."""
    import torch
    import torch.distributed.checkpoint as dcp
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        cache = "cold: page cache dropped"
    except OSError:
        cache = "warm: the page cache could not be dropped here"

    def fresh():
        return {k: torch.empty_like(t) for k, t in sd.items()}

    def same(got):
        return all(torch.equal(got[k], t) for k, t in sd.items())

    line = []
    root = os.path.join(a.dir, "dcp-keep")
    if os.path.isdir(root):
        dst = fresh()
        kw = {"no_dist": True} if "no_dist" in inspect.signature(dcp.load).parameters else {}
        try:
            sync()
            t0 = time.perf_counter()
            dcp.load(dst, checkpoint_id=root, **kw)
            sync()
            d_ms = (time.perf_counter() - t0) * 1e3
            line.append("dcp.load %.0f ms (%s)" % (d_ms, "equal" if same(dst) else "DIFFERS"))
        except Exception as e:  # noqa: BLE001
            line.append("dcp.load FAILED in torch: %s" % why(e))
            d_ms = None
        del dst
    else:
        d_ms = None
        line.append("no DCP checkpoint kept")
    dst = fresh()
    try:
        import rekindle
        rk = rekindle.init(ckpt_dir=os.path.join(a.dir, "rk"), ckpt_every=0, snapshot_every=0)
        for k, t in dst.items():
            rk.register(k, t)
        sync()
        t0 = time.perf_counter()
        rk.resume()
        sync()
        r_ms = (time.perf_counter() - t0) * 1e3
        ok = same(dst)
        rk.finalize()
    except Exception as e:  # noqa: BLE001
        fail("rekindle's resume", e)
    line.append("rekindle resume %.0f ms (%s)" % (r_ms, "equal" if ok else "DIFFERS"))
    say("%s: restore into new tensors on %s (%s): %s%s" % (size, dev.type, cache, ", ".join(line),
                                                     "; rekindle / dcp %.2fx" % (r_ms / d_ms) if d_ms else ""))
    if not ok or "DIFFERS" in line[0]:
        sys.exit(1)


if __name__ == "__main__":
    main()
