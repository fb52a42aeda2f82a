"""tests/py/dcp_train.py CKPT STEPS EVERY - a DistributedDataParallel job over Gloo that
checkpoints with torch.distributed.checkpoint through Rekindle's storage, written from
docs/PYTHON.md ("A DCP program under `rekindle run`") alone, run by tests/py/job_check.py
(mode dcp) under `rekindle run --max-restarts 1`: rekindle.init() for the rendezvous,
init_process_group("gloo"), DCP's AppState, dcp.save with rekindle.dcp.Writer(CKPT,
step=S) every EVERY steps, and at every (re)launch dcp.load with rekindle.dcp.Reader of
rekindle.dcp.latest(CKPT).

Rank 0 prints "step S loss L world W" per step and "restored step S" after a load; every
rank prints "final step=N world=W hash=<16 hex>" (BLAKE2b of the model's and Adam's
state) at the end.
"""
import datetime
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP

import rekindle
import rekindle.dcp


class AppState(Stateful):
    """DCP's recipe: the model's and the optimizer's state dicts, saved and loaded as one."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


ckpt, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
torch.manual_seed(3)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.MSELoss()
BATCH = 24


def batch(step, rank, world):
    """This rank's part of step `step`'s global batch."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)
    lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
    return x[lo:hi], y[lo:hi]


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


rk = rekindle.init()  # under `rekindle run`: the rendezvous of init_process_group
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
ddp = DDP(model)
app = AppState(model, optimizer)
step = rekindle.dcp.latest(ckpt) or 0
if step:
    dcp.load({"app": app}, storage_reader=rekindle.dcp.Reader(ckpt, step=step))
    if rank == 0:
        say("restored step %d" % step)
while step < steps:
    x, y = batch(step, rank, world)
    optimizer.zero_grad()
    loss = loss_fn(ddp(x), y)
    loss.backward()
    optimizer.step()
    if rank == 0:
        say("step %d loss %.6g world %d" % (step, loss.item(), world))
    step += 1
    if step % every == 0:
        dcp.save({"app": app}, storage_writer=rekindle.dcp.Writer(ckpt, step=step))
h = hashlib.blake2b(digest_size=8)
model_sd, optim_sd = get_state_dict(model, optimizer)
for sd in (model_sd, optim_sd["state"]):
    for k in sorted(sd, key=str):
        for t in (sd[k].values() if isinstance(sd[k], dict) else [sd[k]]):
            h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
say("final step=%d world=%d hash=%s" % (step, world, h.hexdigest()))
dist.destroy_process_group()
rk.finalize()
