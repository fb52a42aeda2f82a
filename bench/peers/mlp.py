"""bench/peers/mlp.py - examples/torch_train.py's job for the peers' training programs
(bench/peers/tft_train.py, bench/peers/dcp_train.py): the same MLP (64 -> H -> H -> 10,
ReLU) from the same seed, the same digits read from scikit-learn's file, the same global
batch at every step, Adam at the same learning rate. Keep it equal to torch_train.py.
"""
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import xxhash

DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"


def setup():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def digits(path=DIGITS):
    rows = np.loadtxt(path, delimiter=",")
    x = torch.from_numpy((rows[:, :-1] / 16.0).astype(np.float32))
    y = torch.from_numpy(rows[:, -1].astype(np.int64))
    return x, y


def model(hidden, seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


class Batches:
    """Step s's global batch: positions s*B ... s*B+B-1 of a permutation of the data
    (from the seed); rank r of W takes [r*B/W, (r+1)*B/W)."""

    def __init__(self, n, seed, batch):
        self.n, self.batch = n, batch
        self.order = torch.from_numpy(np.random.default_rng(seed).permutation(n))

    def slice(self, step, r, world):
        pos = (torch.arange(self.batch) + step * self.batch) % self.n
        return self.order[pos[r * self.batch // world:(r + 1) * self.batch // world]]


def state_hash(module, optimizer):
    """XXH64 of the model's state_dict tensors, then every optimizer state tensor (in
    parameter order): equal states give equal hashes."""
    h = xxhash.xxh64()
    for t in module.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    for p in (p for g in optimizer.param_groups for p in g["params"]):
        for v in optimizer.state.get(p, {}).values():
            if isinstance(v, torch.Tensor):
                h.update(v.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def say(line):
    sys.stdout.write("%s t=%.6f\n" % (line, time.time()))
    sys.stdout.flush()
