#!/usr/bin/env python3
"""examples/horovod_style.py - a training script in Elastic Horovod's style, on Rekindle.

    RK_CKPT_DIR=ckpt rekindle run -n 3 [--spares 1] -- python3 examples/horovod_style.py [--epochs 10] [--steps N]

It is Horovod's elastic PyTorch MNIST example (horovod/horovod,
examples/elastic/pytorch/pytorch_mnist_elastic.py, Apache-2.0) written again for
Rekindle, with the ElasticSampler of Horovod's later elastic examples
(pytorch_imagenet_resnet50_elastic.py): the same structure (hvd.init, ElasticSampler,
DistributedOptimizer, @hvd.elastic.run around the epochs and their batches with
state.commit() after each, an end_epoch that commits, TorchState with the sampler, epoch
and batch, a reset callback that rescales the learning rate). Started with spares, the
job grows in place while it trains when RK_RUN_DIR/grow is written (docs/LAUNCHER.md):
every worker's commit() or optimizer step raises HostsUpdatedInterrupt, run() calls
on_state_reset at the new size and train() again, the joining spare starts train() with
the others' state, and the sampler shares out the rest of the epoch over the new world.
What differs from the original, line by line:

  import horovod.torch as hvd          -> import rekindle.elastic as hvd (hvd.elastic.run,
                                          hvd.elastic.TorchState, hvd.elastic.ElasticSampler
                                          -> hvd.run, hvd.TorchState, hvd.ElasticSampler)
  hvd.init()                           -> hvd.init(); RK_CKPT_DIR must be set: commits are
                                          held in memory only with a checkpoint directory
  datasets.MNIST (torchvision)         -> scikit-learn's load_digits (8x8 images), in memory,
                                          read before hvd.init(); --samples N: its first N
  Net: conv 5x5 on 28x28, Dropout2d,   -> conv 3x3 on 8x8, no dropout: dropout's random
       F.dropout                          numbers are not part of the state, so a run after
                                          a loss could not equal a run without one
  args.cuda, pin_memory, .cuda()       -> removed (the CPU; Rekindle's CUDA path works the
                                          same, docs/PYTHON.md)
  --fp16-allreduce, --use-adasum       -> removed: compression and Adasum are not offered
  hvd.DistributedOptimizer(..., compression=, op=)
                                       -> hvd.DistributedOptimizer(optimizer, named_parameters=)
  DistributedSampler, steps_remaining  -> hvd.ElasticSampler in the state, record_batch after
                                          each batch, set_epoch in end_epoch (as the ResNet-50
                                          example): after a loss or a growth the epoch goes on
                                          where it was, over the workers there are now
  state.step (new scalar), --steps     -> the commits so far, Rekindle's step: --steps stops
                                          there (a test replays a job up to a step)
  --count-samples (new)                -> how often each sample was trained on, kept in the
                                          state (it rolls back with the rest); rank 0 says at
                                          each epoch's end whether each was trained on once
  torch.use_deterministic_algorithms   -> added: runs are bitwise reproducible
  test() with metric_average (hvd.allreduce)
                                       -> every rank holds the same model: rank 0 scores the
                                          whole data set alone
  (end)                                -> "final step=N world=W hash=H" on every rank (the
                                          contract's line; hash: XXH64 of the registered
                                          state, rekindle.Context.state_hash), then
                                          hvd.shutdown(); a spare never needed exits 0
"""
import argparse
import itertools
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import rekindle  # noqa: E402
import rekindle.elastic as hvd  # noqa: E402

# Training settings
parser = argparse.ArgumentParser(description='PyTorch digits example, Elastic Horovod style on Rekindle')
parser.add_argument('--batch-size', type=int, default=32, metavar='N',
                    help='input batch size for training, per worker (default: 32)')
parser.add_argument('--epochs', type=int, default=10, metavar='N',
                    help='number of epochs to train (default: 10)')
parser.add_argument('--steps', type=int, default=None, metavar='N',
                    help='stop after N commits in all (default: run every epoch)')
parser.add_argument('--lr', type=float, default=0.01, metavar='LR',
                    help='learning rate (default: 0.01)')
parser.add_argument('--momentum', type=float, default=0.5, metavar='M',
                    help='SGD momentum (default: 0.5)')
parser.add_argument('--seed', type=int, default=42, metavar='S',
                    help='random seed (default: 42)')
parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                    help='how many batches to wait before logging training status')
parser.add_argument('--samples', type=int, default=None, metavar='N',
                    help='train on the first N samples of the data set (default: all 1797)')
parser.add_argument('--count-samples', action='store_true', default=False,
                    help='keep in the state how often each sample was trained on, and say at each '
                         'epoch\'s end whether each was trained on once')
args = parser.parse_args()


def digits():
    d = load_digits()
    x = torch.from_numpy((d.data / 16.0).astype(np.float32)).view(-1, 1, 8, 8)[:args.samples]
    return torch.utils.data.TensorDataset(x, torch.from_numpy(d.target.astype(np.int64))[:args.samples])


# Read before hvd.init(): from there on the workers' heartbeats run, and three
# interpreters loading a data set at once on a small machine should not starve them.
train_dataset = digits()

# Horovod: initialize library.
hvd.init()
torch.manual_seed(args.seed)

# Horovod: limit # of CPU threads to be used per worker.
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


def say(line):
    sys.stdout.write(line + "\n")  # one write per line: the launcher forwards them whole
    sys.stdout.flush()


# Horovod: use ElasticSampler to partition the training data. It shares out the samples of
# the epoch not yet processed over the workers there are at each iteration over it, so it
# is made once, a spare (rekindle run --spares: rank -1 until brought in) included.
train_sampler = hvd.ElasticSampler(train_dataset, shuffle=True, seed=args.seed)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=3)
        self.fc1 = nn.Linear(90, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = x.view(-1, 90)
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


class SampleCounts(nn.Module):
    """--count-samples: how many times each sample was trained on, as a buffer of a module
    given to the TorchState: it rolls back with the model after a loss or a growth."""

    def __init__(self, n):
        super(SampleCounts, self).__init__()
        self.register_buffer('trained', torch.zeros(n, dtype=torch.int64))

    def add(self, indices):
        seen = torch.bincount(torch.tensor(indices, dtype=torch.int64), minlength=len(self.trained))
        hvd.context().allreduce(seen, 'sum')  # every worker's batch
        self.trained += seen


model = Net()
counts = SampleCounts(len(train_dataset)) if args.count_samples else None

# Horovod: scale learning rate by the number of workers.
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)


def done(state):
    return args.steps is not None and state.step >= args.steps


def commit(state):
    state.step += 1
    state.commit()


def end_epoch(state):
    if counts is not None and hvd.rank() == 0:
        t, want = counts.trained, state.epoch + 1
        say('Epoch {}: {}'.format(state.epoch, 'each of the {} samples trained on once'.format(len(t))
                                  if bool((t == want).all()) else '{} samples not trained on, {} more than once'.format(
                                      int((t < want).sum()), int((t > want).sum()))))
    state.epoch += 1
    state.batch = 0
    train_sampler.set_epoch(state.epoch)
    commit(state)


@hvd.run
def train(state):
    # post synchronization event (worker added, worker removed) init ...
    while state.epoch < args.epochs:
        state.model.train()
        for state.batch, (data, target) in enumerate(train_loader):
            if done(state):
                return
            state.optimizer.zero_grad()
            output = state.model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            state.optimizer.step()
            if counts is not None:
                counts.add(train_sampler.get_indices(state.batch, args.batch_size))
            train_sampler.record_batch(state.batch, args.batch_size)
            if state.batch % args.log_interval == 0 and hvd.rank() == 0:
                # Horovod: use train_sampler to determine the number of examples in
                # this worker's partition.
                say('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                    state.epoch, state.batch * len(data), len(train_sampler),
                    100.0 * state.batch / len(train_loader), loss.item()))
            commit(state)
        if done(state):
            return
        end_epoch(state)


def test():
    model.eval()
    with torch.no_grad():
        x, y = train_dataset.tensors
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    if hvd.rank() == 0:
        say('\nTrain set accuracy: {:.2f}%\n'.format(100. * accuracy))


# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


# adjust learning rate on reset
def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group['lr'] = args.lr * hvd.size()
    if hvd.rank() == 0:
        say('Reset: {} workers, epoch {} goes on from {} of its {} samples'.format(
            hvd.size(), train_sampler.epoch, train_sampler.processed, len(train_dataset)))


state = hvd.TorchState(model, optimizer, train_sampler=train_sampler, epoch=0, batch=0, step=0,
                       **({'counts': counts} if counts is not None else {}))
state.register_reset_callbacks([on_state_reset])
try:
    train(state)
except rekindle.SpareUnused:
    say("horovod_style: spare worker not needed: the job finished without it")
    hvd.shutdown()
    sys.exit(0)
test()
say("final step=%d world=%d hash=%s" % (state.step, hvd.size(), hvd.context().state_hash()))
hvd.shutdown()
