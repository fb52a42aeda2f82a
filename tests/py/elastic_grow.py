"""tests/py/elastic_grow.py - a program written from docs/PYTHON.md ("Horovod Elastic API",
"Growing in place") alone, run by tests/py/grow_check.py (mode program) under
`rekindle run -n 3 --spares 1`, which writes RK_RUN_DIR/grow once a checkpoint is committed:

    elastic_grow.py EPOCHS

A data set of 240 samples whose values are 1..240, a DataLoader over an ElasticSampler
(shuffled, 4 samples a batch: what is left of an epoch after k steps of 3 workers, 240 - 12k,
is shared out over 4 without the padding that would take a sample twice), a
linear model under a DistributedOptimizer (SGD with momentum), and a TorchState holding
them with `epoch` and a float `total`. Every step trains on the batch, adds the sum of the
values every worker took (hvd.context().allreduce) to `total`, records the batch, asks
check_host_updates() every 5th batch, and commits; an epoch's end commits too. len(loader)
must stay what it was at the iteration's first batch (a change is noted). Each
interrupt the function sees is noted with the call it came from (re-raised for run()).
Each sample taken once an epoch gives total = EPOCHS * 28920. Every worker that ends
prints one line:
    grow launch L rank R: total T epochs E size S resets [...] interrupts [...] lens [...] hash H
resets: size() in each reset callback; interrupts: "<exception>@<call>"; lens: "<first>-><now>"
for the first 5 changes of len(loader) inside an iteration.
"""
import os
import sys

import torch
from torch.utils.data import DataLoader

import rekindle
import rekindle.elastic as hvd

LAUNCH = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
EPOCHS = int(sys.argv[1])

hvd.init()  # RK_CKPT_DIR set by the caller
torch.manual_seed(3)
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
data = [float(v) for v in range(1, 241)]
sampler = hvd.ElasticSampler(data, shuffle=True, seed=11)
loader = DataLoader(data, batch_size=4, sampler=sampler)
model = torch.nn.Linear(1, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-5, momentum=0.5))
resets, interrupts, lens = [], [], []


@hvd.run
def train(state):
    at = None
    try:
        while state.epoch < EPOCHS:
            for state.batch, x in enumerate(loader):
                first = len(loader) if state.batch == 0 else first
                if len(loader) != first and len(lens) < 5:
                    lens.append("%d->%d" % (first, len(loader)))
                at = "step"
                optimizer.zero_grad()
                loss = ((model(x.float().view(-1, 1)) - 1.0) ** 2).mean()
                loss.backward()
                optimizer.step()
                at = "allreduce"
                s = torch.tensor([float(x.sum())], dtype=torch.float64)
                hvd.context().allreduce(s, "sum")
                state.total += s.item()
                sampler.record_batch(state.batch, 4)
                if state.batch % 5 == 4:
                    at = "check_host_updates"
                    state.check_host_updates()
                at = "commit"
                state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            at = "commit"
            state.commit()
    except rekindle.Recovered as e:  # HostsUpdatedInterrupt is one
        interrupts.append("%s@%s" % (type(e).__name__, at))
        raise


def on_reset():
    resets.append(hvd.size())
    for group in optimizer.param_groups:
        group["lr"] = 1e-5 * hvd.size()


state = hvd.TorchState(model, optimizer, train_sampler=sampler, epoch=0, batch=0, total=0.0)
state.register_reset_callbacks([on_reset])
train(state)
print("grow launch %d rank %d: total %.1f epochs %d size %d resets %r interrupts %r lens %r hash %s" % (
    LAUNCH, hvd.rank(), state.total, state.epoch, hvd.size(), resets, interrupts, lens, hvd.context().state_hash()),
    flush=True)
hvd.shutdown()
