#!/usr/bin/env python3
"""examples/torch_train.py - a real PyTorch training job that survives lost workers.

    rekindle run -n 4 -- python3 examples/torch_train.py --steps 300 [--ddp | --zero] [--device cuda]

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

--zero (ZeRO stage 1): Adam's moments are sharded. The parameters, flattened in
model.parameters() order, are split evenly over the W ranks (rank r: P // W of them, one
more if r < P % W, in rank order); rank r holds Adam's m and v of its slice only,
registered SHARDED as "optim/m" and "optim/v" (then the step counter "optim/t"), updates
its slice of the parameters from the averaged gradient, and the parameters are made
whole again by an allgather (a byte-wise MAX allreduce of the flat parameters, zero
outside each rank's slice: exact). After a recovery the slices are those of the new
world: ZeroAdam.reshard takes them (rk.shard_rows, rk.rebind).

--device cuda: the model, its Adam state and the data on the GPU (worker r of a host uses
device r mod the host's device count); the gradients are averaged by NCCL on the device,
and snapshots are copied from it to pinned host memory while the next step computes
(docs/GPU.md). cuBLAS is made deterministic (CUBLAS_WORKSPACE_CONFIG=:4096:8), so a CUDA run
is bitwise reproducible like a CPU one; its bits differ from the CPU's (other kernels).
Not with --zero (sharded state is host memory only).

Any collective may find a lost member, the last one too (the final hash gathers the
sharded moments): after rekindle.Recovered the program goes back to its loop at the
step the recovery names, wherever it was.

Output (the contract's lines): rank 0 prints "step S loss L world W" per step; every
rank prints "final step=N world=W hash=<16 hex>", the XXH64 of the registered tensors'
bytes in registration order (the model's state_dict, then the optimizer's state; with
--zero the global m and v, gathered, so every rank prints the same).
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
    p.add_argument("--zero", action="store_true", help="shard Adam's moments over the workers (ZeRO-1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train (default cpu)")
    p.add_argument("--data", metavar="FILE",
                   help="the digits as scikit-learn ships them (sklearn/datasets/data/digits.csv.gz), "
                        "read directly: for a machine without scikit-learn")
    p.add_argument("--save-state", metavar="FILE",
                   help="rank 0 saves the model's final state_dict() with torch.save (to compare with rekindle.load)")
    a = p.parse_args()
    if a.steps < 0 or a.batch < 1 or a.hidden < 1:
        p.error("--steps must be >= 0, --batch and --hidden >= 1")
    if a.ddp and a.zero:
        p.error("--ddp and --zero exclude each other: the DDP hook needs a registered torch optimizer")
    if a.zero and a.device == "cuda":
        p.error("--zero is for --device cpu: sharded state is registered in host memory only")
    return a


def digits(path=None):
    """scikit-learn's load_digits: 1,797 8x8 images (64 values 0..16) and their labels.
    With path, its file read directly (the same CSV: 64 pixels, then the label)."""
    if path:
        rows = np.loadtxt(path, delimiter=",")
        data, target = rows[:, :-1], rows[:, -1]
    else:
        from sklearn.datasets import load_digits
        d = load_digits()
        data, target = d.data, d.target
    x = torch.from_numpy((data / 16.0).astype(np.float32))
    y = torch.from_numpy(target.astype(np.int64))
    return x, y


def pick_device(name):
    """cpu, or this worker's GPU: local rank mod the host's devices (mpirun and
    `rekindle run` give OMPI_COMM_WORLD_LOCAL_RANK). None when CUDA has no device."""
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        return None
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def make_ddp(model):
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return nn.parallel.DistributedDataParallel(model)


class ZeroAdam:
    """Adam (ZeRO stage 1) whose moments m and v hold this rank's slice of the flat
    parameters only. The gradients must be averaged over the ring before step()."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params = list(params)
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        self.flat = torch.zeros(sum(p.numel() for p in self.params))
        self.t = torch.zeros((), dtype=torch.int64)

    def register(self, rk, prefix):
        """m and v as this rank's even slice (collective, like any SHARDED registration;
        a spare, outside the ring until a loss brings it in, registers none yet)."""
        P, W, r = self.flat.numel(), rk.world, rk.rank
        rows = P // W + (r < P % W) if r >= 0 else 0
        self.prefix, self.m, self.v = prefix, torch.zeros(rows), torch.zeros(rows)
        rk.register(prefix + "/m", self.m, rekindle.SHARDED)
        rk.register(prefix + "/v", self.v, rekindle.SHARDED)
        rk.register(prefix + "/t", self.t)
        self.offset = rk.shard_rows(prefix + "/m").offset

    def reshard(self, rk):
        """After rekindle.Recovered (and after resume(): a spare brought in learns its
        slice only then): the slice of the current world. One of the same size was
        restored in place (its offset may have moved); one of another size is taken in
        new tensors, which rk.rebind fills with the restored rows."""
        offset, rows, _ = rk.shard_rows(self.prefix + "/m")
        self.offset = offset
        if rows != self.m.numel():
            self.m, self.v = torch.zeros(rows), torch.zeros(rows)
            rk.rebind(self.prefix + "/m", self.m)
            rk.rebind(self.prefix + "/v", self.v)

    @torch.no_grad()
    def step(self, rk):
        lo, hi = self.offset, self.offset + self.m.numel()
        g = torch.cat([p.grad.reshape(-1) for p in self.params])[lo:hi]
        self.t += 1
        t = int(self.t)
        self.m.mul_(self.b1).add_(g, alpha=1 - self.b1)
        self.v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
        denom = (self.v / (1 - self.b2 ** t)).sqrt_().add_(self.eps)
        self.flat.zero_()
        mine = self.flat[lo:hi]
        mine.copy_(torch.cat([p.reshape(-1) for p in self.params])[lo:hi])
        mine.addcdiv_(self.m, denom, value=-self.lr / (1 - self.b1 ** t))
        rk.allreduce(self.flat.view(torch.uint8), "max")  # the allgather
        at = 0
        for p in self.params:
            p.copy_(self.flat[at:at + p.numel()].view_as(p))
            at += p.numel()


def main():
    a = parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
    torch.set_num_threads(1)  # the same arithmetic on every rank and every run
    torch.use_deterministic_algorithms(True)
    device = pick_device(a.device)
    if device is None:
        print("torch_train: --device cuda: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    x_all, y_all = digits(a.data)
    order = torch.from_numpy(np.random.default_rng(a.seed).permutation(len(y_all)))
    torch.manual_seed(a.seed)
    model = nn.Sequential(nn.Linear(64, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(),
                          nn.Linear(a.hidden, 10))
    # The same initial weights on every device: made on the CPU, then moved.
    model.to(device)
    x_all, y_all = x_all.to(device), y_all.to(device)
    optim = ZeroAdam(model.parameters(), a.lr) if a.zero else torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()

    rk = rekindle.init()
    status = 0
    try:
        rk.register_module("model", model)
        if a.zero:
            optim.register(rk, "optim")
        else:
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
        if a.zero:
            optim.reshard(rk)
        loss_buf = torch.zeros(1, device=device)
        while True:
            try:
                while step < a.steps:
                    W, r = rk.world, rk.rank
                    pos = (torch.arange(a.batch) + step * a.batch) % len(y_all)
                    idx = order[pos[r * a.batch // W:(r + 1) * a.batch // W]]
                    model.zero_grad(set_to_none=False)
                    loss = loss_fn(net(x_all[idx]), y_all[idx])
                    loss.backward()
                    if not a.ddp:
                        rk.allreduce_gradients(model)
                    if a.zero:
                        optim.step(rk)
                    else:
                        optim.step()  # raises Recovered if the DDP hook saw a recovery
                    loss_buf[0] = loss.detach()
                    rk.allreduce(loss_buf, "avg")
                    if r == 0:
                        say("step %d loss %.6g world %d" % (step, loss_buf.item(), W))
                    rk.step_done(step)
                    step += 1
                final = rk.state_hash()  # with --zero a collective too
                break
            except rekindle.Recovered as rec:
                if a.zero:
                    optim.reshard(rk)
                step = rec.next_step
        say("final step=%d world=%d hash=%s" % (step, rk.world, final))
        if a.save_state and rk.rank == 0:
            torch.save(model.state_dict(), a.save_state)
    except rekindle.Error as e:
        print("torch_train: %s" % e, file=sys.stderr)
        status = 1
    try:
        # A checkpoint a recovery abandoned is no error; one that failed on its own (I/O, a
        # full disk) and that no later checkpoint superseded is: the state is not on disk.
        rk.finalize()
    except rekindle.Error as e:
        if e.name == "RK_E_TIMEOUT":  # a writer stuck on a dead disk: see rk_finalize
            print("torch_train: warning: finalize: %s" % e, file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        print("torch_train: finalize: %s" % e, file=sys.stderr)
        status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
