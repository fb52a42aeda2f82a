"""tests/py/docs_train.py - a training program written from docs/PYTHON.md alone, run by
tests/py/job_check.py (mode docs) as a real job: init, register_module,
register_optimizer, resume, the loop with `except rekindle.Recovered`, and the end the
docs describe, nothing more (no rk.wait() before finalizing).

    docs_train.py STEPS with   the `with rekindle.init() as rk:` form
    docs_train.py STEPS call   rk = rekindle.init() ... rk.finalize()

Options come from RK_* (RK_CKPT_DIR, RK_CKPT_EVERY, ...). Rank 0 prints "step S loss L
world W" per step; every rank prints "final step=N world=W hash=<16 hex>" (rk.state_hash())
after the loop. An exception (a failed finalize too) ends it with a traceback, exit 1.
"""
import sys

import torch
import torch.nn as nn

import rekindle

steps, form = int(sys.argv[1]), sys.argv[2]
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


def train(rk):
    rk.register_module("model", model)
    rk.register_optimizer("optim", optimizer)
    step = rk.resume()
    while step < steps:
        try:
            x, y = batch(step, rk.rank, rk.world)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            rk.allreduce_gradients(model)
            optimizer.step()
            if rk.rank == 0:
                say("step %d loss %.6g world %d" % (step, loss.item(), rk.world))
            rk.step_done(step)
            step += 1
        except rekindle.Recovered as r:
            step = r.next_step
    say("final step=%d world=%d hash=%s" % (step, rk.world, rk.state_hash()))


if form == "with":
    with rekindle.init() as rk:
        train(rk)
else:
    rk = rekindle.init()
    train(rk)
    rk.finalize()
