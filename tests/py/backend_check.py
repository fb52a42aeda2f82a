"""tests/py/backend_check.py - the torch.distributed backend "rekindle"
(python/rekindle/backend.py, invariants P1-P5), run by tests/test_python.c on real MPI ranks.

    backend_check.py BUILD DIR collectives     every rank (mpirun -n 3)
        init_process_group("rekindle") after rekindle.init() with no other argument (the
        env:// variables filled from the job); rank and size are the job's (P1); every
        offered call gives the exact result and a complete Work (P2): allreduce SUM, AVG,
        MAX, MIN (float and int), broadcast from rank 1, all_gather,
        all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, barrier; a float
        sum is the parts added in rank order, bitwise, wherever the elements sit in the
        buffer (P3); the calls not offered raise rekindle.Error RK_E_NOTAVAIL at once (P5).
        Prints "backend_check collectives: ok" on every rank.
    backend_check.py BUILD DIR loss            one process
        Runs itself (mode loss-worker) as a 3-worker job under BUILD's `rekindle run`: an
        unchanged DDP (no comm hook) on the backend; at step 3 the worker of launch
        rank 2 SIGKILLs itself inside its backward pass. The two survivors' DDP allreduce
        finds the loss: the Work completes, backward() returns, and optimizer.step() raises
        rekindle.Recovered before it changes anything (P4), the model and Adam's state
        bitwise as at the start of the step rolled back to; then DDP goes on over 2 ranks
        (getSize 2: P1), both ending with the same state hash. Prints
        "backend_check loss-worker: ok" on each survivor; the job must end with exit 0 and
        both, then "backend_check loss: ok" is printed. Needs torch >= 2
        (tests/test_python_backend.c skips under 1.13, naming what it lacks).
    ... MODE --device cuda                     the same on CUDA tensors of device 0 (every
        tensor given to the group, the model and its data; tests/test_python_cuda.c).
Exit 0 when every check passed; otherwise a message saying which and why (exit 1).
"""
import os
import re
import signal
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import rekindle

BUILD, DIR, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
DEVICE = sys.argv[5] if len(sys.argv) == 6 and sys.argv[4] == "--device" else "cpu"
DEV = torch.device("cuda", 0) if DEVICE == "cuda" else torch.device("cpu")


def dv(t):
    """t on the device the check runs on."""
    return t.to(DEV)
LAUNCH = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def say(line):
    sys.stdout.write("backend_check %s: %s\n" % (MODE, line))
    sys.stdout.flush()


def check(cond, what):
    if not cond:
        say("FAILED (launch rank %d): %s" % (LAUNCH, what))
        os._exit(1)


def bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def collectives():
    rk = rekindle.init(ckpt_dir=os.path.join(DIR, "ckpt"))
    dist.init_process_group("rekindle")
    r, w = rk.rank, rk.world
    check((dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (r, w, "rekindle"),
          "rank, size, backend %s, want %s" % ((dist.get_rank(), dist.get_world_size(), dist.get_backend()),
                                              (r, w, "rekindle")))
    # P3: float sums are the parts added in rank order, wherever the elements sit.
    g = torch.Generator().manual_seed(7)
    parts = [torch.randn(1000, generator=g) * 10 ** torch.randint(-8, 8, (1000,), generator=g) for _ in range(w)]
    want = parts[0].clone()
    for p in parts[1:]:
        want += p
    t = dv(parts[r].clone())
    work = dist.all_reduce(t, async_op=True)
    check(work.is_completed(), "the allreduce's Work is not complete when the call returned (P2)")
    work.wait()
    check(bits_equal(t.cpu(), want), "allreduce SUM differs from the parts added in rank order")
    flipped = dv(parts[r].flip(0).clone())
    dist.all_reduce(flipped)
    check(bits_equal(flipped.cpu().flip(0), want), "a float sum depends on where the elements sit (P3)")
    if hasattr(dist.ReduceOp, "AVG"):
        t = dv(parts[r].clone())
        dist.all_reduce(t, dist.ReduceOp.AVG)
        check(bits_equal(t.cpu(), want / w), "allreduce AVG differs from the rank-order sum / world")
    for op, fn in ((dist.ReduceOp.MAX, max), (dist.ReduceOp.MIN, min)):
        t = dv(torch.tensor([r * 3, -r], dtype=torch.int64))
        dist.all_reduce(t, op)
        check(t.tolist() == [fn(i * 3 for i in range(w)), fn(-i for i in range(w))], "allreduce %s: %s" % (op, t))
    t = dv(torch.tensor([r + 1], dtype=torch.int32))
    dist.all_reduce(t)
    check(t.item() == w * (w + 1) // 2, "int sum %s" % t)
    b = dv(torch.full((5,), float(r)).double())
    dist.broadcast(b, 1)
    check(torch.equal(b.cpu(), torch.full((5,), 1.0).double()), "broadcast from rank 1: %s" % b)
    outs = [dv(torch.zeros(3)) for _ in range(w)]
    dist.all_gather(outs, dv(torch.full((3,), float(r))))
    check(all(torch.equal(o.cpu(), torch.full((3,), float(i))) for i, o in enumerate(outs)), "all_gather %s" % outs)
    if hasattr(dist, "all_gather_into_tensor"):
        out = dv(torch.zeros(w * 2, dtype=torch.int64))
        dist.all_gather_into_tensor(out, dv(torch.tensor([r, -r])))
        check(out.tolist() == [v for i in range(w) for v in (i, -i)], "all_gather_into_tensor %s" % out)
    o = dv(torch.zeros(2))
    dist.reduce_scatter(o, [dv(torch.full((2,), float(r * 10 + i))) for i in range(w)])
    check(torch.equal(o.cpu(), torch.full((2,), float(sum(i * 10 + r for i in range(w))))), "reduce_scatter %s" % o)
    if hasattr(dist, "reduce_scatter_tensor"):
        o = dv(torch.zeros(2))
        dist.reduce_scatter_tensor(o, dv(torch.arange(2 * w, dtype=torch.float32) * (r + 1)))
        check(torch.equal(o.cpu(), torch.tensor([2.0 * r, 2.0 * r + 1]) * (w * (w + 1) // 2)),
              "reduce_scatter_tensor %s" % o)
    dist.barrier()
    for what, call in (("send", lambda: dist.send(dv(torch.zeros(1)), (r + 1) % w)),
                       ("recv", lambda: dist.recv(dv(torch.zeros(1)), (r + 1) % w)),
                       ("reduce", lambda: dist.reduce(dv(torch.zeros(1)), 0)),
                       ("all_to_all_single", lambda: dist.all_to_all_single(dv(torch.zeros(w)), dv(torch.zeros(w))))):
        try:
            call()
            check(False, "%s did not raise" % what)
        except rekindle.Error as e:
            check(e.name == "RK_E_NOTAVAIL" and what in e.message, "%s raised %s" % (what, e))
    try:
        t = dv(torch.zeros(1, dtype=torch.float64))
        dist.all_reduce(t, dist.ReduceOp.PRODUCT)
        check(False, "PRODUCT did not raise")
    except rekindle.Error as e:
        check(e.name == "RK_E_OP", "PRODUCT raised %s" % e)
    dist.destroy_process_group()
    rk.finalize()
    say("ok")


def loss():
    cmd = [os.path.join(BUILD, "bin", "rekindle"), "run", "-n", "3", "--", sys.executable, os.path.abspath(__file__),
           BUILD, DIR, "loss-worker", "--device", DEVICE]
    scale = int(os.environ.get("RK_TEST_TIME_SCALE", "1") or 1)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240 * scale,
                           start_new_session=True)
    except subprocess.TimeoutExpired as e:
        check(False, "the job did not end within %d s:\n%s" % (240 * scale, e.output))
    oks = re.findall(r"backend_check loss-worker: ok", p.stdout)  # unanchored: mpirun interleaves lines
    check(p.returncode == 0 and len(oks) == 2, "exit %d, %d survivors' ok, want 0 and 2:\n%s" % (
        p.returncode, len(oks), p.stdout[-4000:]))
    say("ok")


def loss_worker():
    torch.set_num_threads(1)
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(DEV)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    rk = rekindle.init(ckpt_dir=os.path.join(DIR, "ckpt"), ckpt_every=1000)
    dist.init_process_group("rekindle")
    rk.register_module("model", model)
    rk.register_optimizer("optim", optimizer)
    step = rk.resume()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if LAUNCH == 2:  # SIGKILLs itself inside the backward pass of step 3
        model[0].weight.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL) if step == 3 else None)
    snap, seen, where = {}, [], "forward or backward"
    while step < 8:
        try:
            snap[step] = {k: v.clone() for k, v in list(model.state_dict().items()) +
                          [("%d.%s" % (i, k), v) for i, s in enumerate(optimizer.state.values())
                           for k, v in s.items()]}
            g = torch.Generator().manual_seed(step)
            x = dv(torch.randn(6, 8, generator=g)[dist.get_rank()::dist.get_world_size()])
            optimizer.zero_grad()
            ddp(x).square().mean().backward()
            where = "step"
            optimizer.step()
            where = "step_done"
            rk.step_done(step)
            step += 1
        except rekindle.Recovered as r:
            seen.append((step, where, r.next_step))
            back = snap[r.next_step]
            now = {k: v for k, v in list(model.state_dict().items()) +
                   [("%d.%s" % (i, k), v) for i, s in enumerate(optimizer.state.values()) for k, v in s.items()]}
            check(all(bits_equal(now[k], back[k]) for k in back), "the state after Recovered is not that of step %d"
                  % r.next_step)
            step = r.next_step
    check([s[1] for s in seen] == ["step"] and seen[0][0] == 3,
          "Recovered seen at %s: want once, from optimizer.step() in step 3" % seen)
    check((dist.get_world_size(), ddp.process_group.size()) == (2, 2), "world after the loss %d" % dist.get_world_size())
    digest = rk.state_hash()
    both = dv(torch.zeros(2, dtype=torch.int64))
    both[dist.get_rank()] = int(digest[:15], 16)
    dist.all_reduce(both, dist.ReduceOp.MAX)
    check(both[0] == both[1], "the survivors' states differ: %s" % both.tolist())
    dist.destroy_process_group()
    rk.finalize()
    say("ok: Recovered from optimizer.step() in step %d, back to step %d, 2 ranks, state %s" % (
        seen[0][0], seen[0][2], digest))


if DEVICE == "cuda":
    check(torch.cuda.is_available(), "--device cuda: torch sees no CUDA device")
    torch.cuda.set_device(0)
{"collectives": collectives, "loss": loss, "loss-worker": loss_worker}[MODE]()
