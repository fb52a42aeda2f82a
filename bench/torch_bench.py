"""bench/torch_bench.py - the Python binding against plain PyTorch, in one run.

    torch_bench.py DIR [--gib G] [--steps K] [--reps R]

Each measurement runs in a process of its own (MPI, under the library, starts once per
process), started by this script.

1. Per-step overhead: the same MLP and Adam trained K steps on one rank, in a plain
   PyTorch loop and in the Rekindle loop (rk.allreduce_gradients + rk.step_done, no
   checkpoints; then with a checkpoint every 50 steps). Runs alternate, R of each; the
   medians and their ratio are printed.
2. A checkpoint of a G GiB state dict (16 float32 tensors): Rekindle (rk.checkpoint(): the
   training stall, then rk.wait(): durable and committed) against torch.save to a file +
   fsync, and torch.distributed.checkpoint.save_state_dict where this torch has it.
   R repetitions each, alternating; medians and ratios printed.
"""
import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import rekindle  # noqa: E402

a = argparse.ArgumentParser()
a.add_argument("dir")
a.add_argument("--gib", type=float, default=1.0)
a.add_argument("--steps", type=int, default=300)
a.add_argument("--reps", type=int, default=3)
a.add_argument("--part", choices=("plain", "rk0", "rk50", "ckpt"), help=argparse.SUPPRESS)
args = a.parse_args()
torch.set_num_threads(1)


def model_and_optim():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return m, torch.optim.Adam(m.parameters(), lr=1e-3)


x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
loss_fn = nn.CrossEntropyLoss()


def plain():
    m, o = model_and_optim()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        o.zero_grad()
        loss_fn(m(x), y).backward()
        o.step()
    return (time.perf_counter() - t0) / args.steps


def with_rekindle(every):
    with rekindle.init(ckpt_dir=os.path.join(args.dir, "ovh"), ckpt_every=0) as rk:
        m, o = model_and_optim()
        rk.register_module("model", m)
        rk.register_optimizer("optim", o)
        t0 = time.perf_counter()
        for step in range(args.steps):
            o.zero_grad()
            loss_fn(m(x), y).backward()
            rk.allreduce_gradients(m)
            o.step()
            rk.step_done(step)
            if every and (step + 1) % every == 0:
                rk.checkpoint()
        rk.wait()
        return (time.perf_counter() - t0) / args.steps


def med(xs):
    return statistics.median(xs)


def part(name):
    """Runs one measurement in a new process; its printed floats."""
    cmd = [sys.executable, os.path.abspath(__file__), args.dir, "--gib", str(args.gib), "--steps", str(args.steps),
           "--reps", "1", "--part", name]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()
    shutil.rmtree(os.path.join(args.dir, "ovh"), ignore_errors=True)
    return [float(v) if v != "None" else None for v in out]


def overhead():
    base, rk0, rk50 = [], [], []
    for _ in range(args.reps):
        base += part("plain")
        rk0 += part("rk0")
        rk50 += part("rk50")
    n = sum(p.numel() for p in model_and_optim()[0].parameters())
    print("per-step, MLP of %d parameters, Adam, batch 128, %d steps, 1 rank, median of %d:" % (n, args.steps, args.reps))
    print("  plain PyTorch loop                  %8.3f ms" % (1e3 * med(base)))
    print("  rekindle, no checkpoints            %8.3f ms   ratio %.3f" % (1e3 * med(rk0), med(rk0) / med(base)))
    print("  rekindle, checkpoint every 50 steps %8.3f ms   ratio %.3f" % (1e3 * med(rk50), med(rk50) / med(base)))


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_once():
    """One repetition: Rekindle's stall and total, torch.save + fsync, and dcp (or None)."""
    per = int(args.gib * (1 << 30)) // 16 // 4
    state = {"layer%02d.weight" % i: torch.randn(per) for i in range(16)}
    ck = os.path.join(args.dir, "ckpt")
    shutil.rmtree(ck, ignore_errors=True)
    with rekindle.init(ckpt_dir=ck, ckpt_every=0, keep=1) as rk:
        for name, t in state.items():
            rk.register(name, t)
        rk.resume()
        t0 = time.perf_counter()
        rk.checkpoint()
        t1 = time.perf_counter()
        rk.wait()
        t2 = time.perf_counter()
    shutil.rmtree(ck, ignore_errors=True)
    path = os.path.join(args.dir, "state.pt")
    t3 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(args.dir)
    t4 = time.perf_counter()
    os.unlink(path)
    dcp = None
    try:
        tdc = importlib.import_module("torch.distributed.checkpoint")
        out = os.path.join(args.dir, "dcp")
        t5 = time.perf_counter()
        tdc.save_state_dict(state, tdc.FileSystemWriter(out), no_dist=True)
        dcp = time.perf_counter() - t5
        shutil.rmtree(out)
    except Exception:
        pass
    print(t1 - t0, t2 - t0, t4 - t3, dcp)


def checkpoint():
    stall, total, ts, dcp = [], [], [], []
    for _ in range(args.reps):
        a1, a2, a3, a4 = part("ckpt")
        stall.append(a1)
        total.append(a2)
        ts.append(a3)
        if a4 is not None:
            dcp.append(a4)
    try:
        importlib.import_module("torch.distributed.checkpoint")
        why = "it failed"
    except Exception as e:  # absent before torch 2.0; broken on some Python versions
        why = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:100])
    nbytes = 16 * (int(args.gib * (1 << 30)) // 16 // 4) * 4
    gb = nbytes / 1e9
    print("checkpoint of a %.2f GiB state dict (16 float32 tensors), median of %d:" % (nbytes / (1 << 30), args.reps))
    print("  torch.save + fsync                  %7.3f s  %6.2f GB/s" % (med(ts), gb / med(ts)))
    print("  rekindle: training stall            %7.3f s  ratio to torch.save %.3f" % (med(stall), med(stall) / med(ts)))
    print("  rekindle: committed and durable     %7.3f s  %6.2f GB/s  ratio to torch.save %.3f" % (
        med(total), gb / med(total), med(total) / med(ts)))
    if dcp:
        print("  torch.distributed.checkpoint        %7.3f s  ratio rekindle/dcp %.3f" % (med(dcp), med(total) / med(dcp)))
    else:
        print("  torch.distributed.checkpoint        not measured: %s (torch %s)" % (why, torch.__version__))


os.makedirs(args.dir, exist_ok=True)
if args.part == "plain":
    print(plain())
elif args.part in ("rk0", "rk50"):
    print(with_rekindle(50 if args.part == "rk50" else 0))
elif args.part == "ckpt":
    checkpoint_once()
else:
    overhead()
    checkpoint()
