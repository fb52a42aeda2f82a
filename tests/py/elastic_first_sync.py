"""tests/py/elastic_first_sync.py - a program written from docs/PYTHON.md ("Horovod Elastic
API") alone, run by tests/py/job_check.py (mode first_sync) under `rekindle run -n 3`:

    elastic_first_sync.py EPOCHS [KILL]

A model, SGD with momentum through DistributedOptimizer, a TorchState with an `epoch`
scalar, a reset callback that records the new size, one commit an epoch. With KILL, the
worker of launch rank 2 SIGKILLs itself just before the first call of the run() function,
so the two others find the loss inside the first call's sync(). Each worker that ends
prints "first_sync rank R: epochs A..B resets [..] hash H" (A: the epoch the function's
last call started from) after checking that every rank holds the same state.
"""
import os
import signal
import sys

import torch
import torch.nn as nn

import rekindle.elastic as hvd

LAUNCH = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
EPOCHS, KILL = int(sys.argv[1]), len(sys.argv) > 2

hvd.init()  # RK_CKPT_DIR set by the caller
torch.manual_seed(LAUNCH)  # other initial weights on every rank: the first sync makes them rank 0's
torch.set_num_threads(1)
model = nn.Linear(4, 3)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
resets, starts = [], []


@hvd.run
def train(state):
    starts.append(state.epoch)
    while state.epoch < EPOCHS:
        x = torch.full((2, 4), float(state.epoch + hvd.rank()))
        state.optimizer.zero_grad()
        state.model(x).pow(2).sum().backward()
        state.optimizer.step()
        state.epoch += 1
        state.commit()
    return state.epoch


state = hvd.TorchState(model, optimizer, epoch=0)
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
if KILL and LAUNCH == 2:
    os.kill(os.getpid(), signal.SIGKILL)
end = train(state)
ctx = hvd.context()
h = int(ctx.state_hash(), 16)
h -= (h >> 63) << 64  # as a signed int64
hi, lo = torch.tensor([h]), torch.tensor([h])
ctx.allreduce(hi, "max")
ctx.allreduce(lo, "min")
same = "same" if hi.item() == lo.item() else "DIFFERENT"
print("first_sync rank %d: epochs %d..%d resets %r state %s on %d ranks hash %s" % (
    LAUNCH, starts[-1], end, resets, same, hvd.size(), ctx.state_hash()), flush=True)
hvd.shutdown()
