"""tests/py/elastic_sampler.py - a program written from docs/PYTHON.md ("Horovod Elastic
API": ElasticSampler) alone, run by tests/py/job_check.py (mode sampler) under
`rekindle run -n 3`:

    elastic_sampler.py EPOCHS KILL_AT

A data set of 120 samples whose values are 1..120, a DataLoader over an ElasticSampler
(shuffled, 2 samples a batch), a TorchState holding the sampler and a float `total`: every
step adds the sum of the values every worker took (an allreduce) to `total`, records the
batch, and commits. The worker of launch rank 2 SIGKILLs itself at its KILL_AT-th commit
(inside an epoch): the survivors roll back to the last commit and go on over 2 workers.
Each sample taken once per epoch in the committed history gives total = EPOCHS * 7260.
Each worker that ends prints "sampler rank R: total T epochs E size S resets [..]".
"""
import os
import signal
import sys

import torch
from torch.utils.data import DataLoader

import rekindle.elastic as hvd

LAUNCH = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
EPOCHS, KILL_AT = int(sys.argv[1]), int(sys.argv[2])

hvd.init()  # RK_CKPT_DIR set by the caller
torch.set_num_threads(1)
data = [float(v) for v in range(1, 121)]
sampler = hvd.ElasticSampler(data, shuffle=True, seed=7)
loader = DataLoader(data, batch_size=2, sampler=sampler)
resets, commits = [], [0]


@hvd.run
def train(state):
    while state.epoch < EPOCHS:
        for batch_idx, x in enumerate(loader):
            s = torch.tensor([float(x.sum())], dtype=torch.float64)
            hvd.context().allreduce(s, "sum")
            state.total += s.item()
            sampler.record_batch(batch_idx, 2)
            commits[0] += 1
            if LAUNCH == 2 and commits[0] == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            state.commit()
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()


state = hvd.TorchState(train_sampler=sampler, epoch=0, total=0.0)
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
train(state)
print("sampler rank %d: total %.1f epochs %d size %d resets %r" % (
    LAUNCH, state.total, state.epoch, hvd.size(), resets), flush=True)
hvd.shutdown()
