#!/usr/bin/env python3
"""examples/torch_train.py - a real PyTorch training job that survives lost workers.

    rekindle run -n 4 -- python3 examples/torch_train.py --steps 300 [--ddp]

An MLP (64 -> H -> H -> 10, ReLU) learns the handwritten digits of scikit-learn's
load_digits with Adam, data parallel over the job's workers through Rekindle's ring.
Checkpoint settings come from RK_* (RK_CKPT_DIR, RK_CKPT_EVERY, ...), as for rk-train.

Data parallelism: step s uses the global batch of B samples at positions s*B ... s*B+B-1
of a fixed permutation of the data set (from --seed), whatever the world size; rank r of
W computes the mean loss of its slice [r*B/W, (r+1)*B/W) and the gradients are averaged
over the ring. Every rank applies the same Adam update, so the replicas stay bitwise
equal; a run is bitwise reproducible given the same checkpoint, world size and arguments.

--ddp: the model is wrapped in DistributedDataParallel (over a one-process gloo group)
and its gradient buckets are averaged by rekindle.allreduce_hook instead of
rk.allreduce_gradients.

Output (the contract's lines): rank 0 prints "step S loss L world W" per step; every
rank prints "final step=N world=W hash=<16 hex>", the XXH64 of the registered tensors'
bytes in registration order (the model's state_dict, then Adam's state).
Exit status: 0 done, 1 a Rekindle call failed, 2 bad arguments.
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import rekindle  # noqa: E402  (the build tree's package unless PYTHONPATH names another)


def say(line):
    """One line in one write(): mpirun forwards each worker's output as it comes, and
    print() writes the line and its newline separately."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args():
    p = argparse.ArgumentParser(description="PyTorch MLP on load_digits, data parallel with Rekindle")
    p.add_argument("--steps", type=int, required=True, help="steps to train (the final step)")
    p.add_argument("--seed", type=int, default=1, help="model init and data order (default 1)")
    p.add_argument("--hidden", type=int, default=64, help="hidden width (default 64)")
    p.add_argument("--batch", type=int, default=60, help="global batch size (default 60)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--ddp", action="store_true", help="average gradients through a DDP comm hook")
    p.add_argument("--save-state", metavar="FILE",
                   help="rank 0 saves the model's final state_dict() with torch.save (to compare with rekindle.load)")
    a = p.parse_args()
    if a.steps < 0 or a.batch < 1 or a.hidden < 1:
        p.error("--steps must be >= 0, --batch and --hidden >= 1")
    return a


def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.from_numpy((d.data / 16.0).astype(np.float32))
    y = torch.from_numpy(d.target.astype(np.int64))
    return x, y


def make_ddp(model):
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return nn.parallel.DistributedDataParallel(model)


def main():
    a = parse_args()
    torch.set_num_threads(1)  # the same arithmetic on every rank and every run
    torch.use_deterministic_algorithms(True)
    x_all, y_all = digits()
    order = torch.from_numpy(np.random.default_rng(a.seed).permutation(len(y_all)))
    torch.manual_seed(a.seed)
    model = nn.Sequential(nn.Linear(64, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(),
                          nn.Linear(a.hidden, 10))
    optim = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()

    rk = rekindle.init()
    status = 0
    try:
        rk.register_module("model", model)
        rk.register_optimizer("optim", optim)
        net = model
        if a.ddp:
            net = make_ddp(model)
            net.register_comm_hook(rk, rekindle.allreduce_hook)
        try:
            step = rk.resume()
        except rekindle.SpareUnused:
            print("torch_train: spare worker not needed: the job finished without it", file=sys.stderr)
            return 0
        loss_buf = torch.zeros(1)
        while step < a.steps:
            try:
                W, r = rk.world, rk.rank
                pos = (torch.arange(a.batch) + step * a.batch) % len(y_all)
                idx = order[pos[r * a.batch // W:(r + 1) * a.batch // W]]
                optim.zero_grad(set_to_none=False)
                loss = loss_fn(net(x_all[idx]), y_all[idx])
                loss.backward()
                if not a.ddp:
                    rk.allreduce_gradients(model)
                optim.step()  # raises Recovered if the DDP hook saw a recovery
                loss_buf[0] = loss.detach()
                rk.allreduce(loss_buf, "avg")
                if r == 0:
                    say("step %d loss %.6g world %d" % (step, loss_buf.item(), W))
                rk.step_done(step)
                step += 1
            except rekindle.Recovered as rec:
                step = rec.next_step
        if os.environ.get("RK_CKPT_DIR"):
            try:
                rk.wait()
            except rekindle.Error as e:
                print("torch_train: warning: a checkpoint failed along the way: %s" % e, file=sys.stderr)
        say("final step=%d world=%d hash=%s" % (step, rk.world, rk.state_hash()))
        if a.save_state and rk.rank == 0:
            torch.save(model.state_dict(), a.save_state)
    except rekindle.Error as e:
        print("torch_train: %s" % e, file=sys.stderr)
        status = 1
    try:
        rk.finalize()
    except rekindle.Error as e:
        print("torch_train: warning: finalize: %s" % e, file=sys.stderr)
        if e.name == "RK_E_TIMEOUT":  # a writer stuck on a dead disk: see rk_finalize
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
