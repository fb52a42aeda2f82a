"""tests/py/backend_train.py - an unchanged DistributedDataParallel on the torch.distributed
backend "rekindle", written from docs/PYTHON.md ("The torch.distributed backend") alone,
run by tests/py/job_check.py (mode backend) as a real job: rekindle.init,
init_process_group("rekindle"), register_module, register_optimizer, resume, DDP(model)
with no comm hook, the loop with `except rekindle.Recovered`, destroy_process_group.

    backend_train.py STEPS

Options come from RK_* (RK_CKPT_DIR, RK_CKPT_EVERY, ...). Rank 0 prints "step S loss L
world W" per step; every rank prints "final step=N world=W hash=<16 hex>" (rk.state_hash())
after the loop, and the world torch.distributed reports beside it.
"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rekindle

steps = int(sys.argv[1])
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
torch.manual_seed(3)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.MSELoss()
BATCH = 24


def batch(step, rank, world):
    """This rank's part of step `step`'s global batch (the same samples whatever the world)."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)
    lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
    return x[lo:hi], y[lo:hi]


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


rk = rekindle.init()
dist.init_process_group("rekindle")
rk.register_module("model", model)
rk.register_optimizer("optim", optimizer)
step = rk.resume()
ddp = DDP(model)
while step < steps:
    try:
        x, y = batch(step, dist.get_rank(), dist.get_world_size())
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0:
            say("step %d loss %.6g world %d" % (step, loss.item(), dist.get_world_size()))
        rk.step_done(step)
        step += 1
    except rekindle.Recovered as r:
        step = r.next_step
say("final step=%d world=%d hash=%s" % (step, dist.get_world_size(), rk.state_hash()))
dist.destroy_process_group()
rk.finalize()
