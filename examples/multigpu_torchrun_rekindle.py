"""examples/multigpu_torchrun_rekindle.py - PyTorch's own DDP tutorial program, ported to
Rekindle: pytorch/examples, distributed/ddp-tutorial-series/multigpu_torchrun.py (its
datautils.py inlined), BSD 3-Clause License, Copyright (c) 2017, Pytorch contributors.
Every line that changed ends in "# rekindle"; docs/PYTHON.md ("Porting a PyTorch
program") shows them beside the original. The original runs on GPUs with NCCL; this one
runs where Rekindle's ring does, here on the CPU (so the device lines changed too).

    rekindle run -n 4 -- python3 examples/multigpu_torchrun_rekindle.py 40 5
"""
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader

import torch.multiprocessing as mp  # noqa: F401
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group, HashStore  # rekindle
import os
import sys  # rekindle
try:  # rekindle
    import rekindle  # rekindle: installed (pip install of the wheel, make install)
except ImportError:  # rekindle: else the source tree's
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))  # rekindle
    import rekindle  # rekindle


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup(snapshot_path, save_every):  # rekindle
    init_process_group(backend="gloo", store=HashStore(), rank=0, world_size=1)  # rekindle
    return rekindle.init(ckpt_dir=snapshot_path, ckpt_every=save_every)  # rekindle


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
        rk,  # rekindle
    ) -> None:
        self.gpu_id = rk.rank  # rekindle
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.rk = rk  # rekindle
        rk.register_module("model", self.model)  # rekindle
        rk.register_optimizer("optim", self.optimizer)  # rekindle
        self.epochs_run = rk.resume()  # rekindle

        self.model = DDP(self.model)  # rekindle
        self.model.register_comm_hook(rk, rekindle.allreduce_hook)  # rekindle

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        # The tutorial's F.cross_entropy over a single output is 0 whatever the weights
        # (a softmax over one class): nothing would train. Its targets are real numbers.
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def train(self, max_epochs: int):
        epoch = self.epochs_run  # rekindle
        while epoch < max_epochs:  # rekindle
            try:  # rekindle
                self._run_epoch(epoch)
                self.rk.step_done(epoch)  # rekindle
                epoch += 1  # rekindle
            except rekindle.Recovered as r:  # rekindle
                self.gpu_id = self.rk.rank  # rekindle
                self.train_data = prepare_dataloader(self.train_data.dataset, self.train_data.batch_size, self.rk)  # rekindle
                epoch = r.next_step  # rekindle


def load_train_objs():
    train_set = MyTrainDataset(2048)  # load your dataset
    model = torch.nn.Linear(20, 1)  # load your model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int, rk):  # rekindle
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=False,  # rekindle
        shuffle=False,
        sampler=DistributedSampler(dataset, num_replicas=rk.world, rank=rk.rank)  # rekindle
    )


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot"):  # rekindle
    rk = ddp_setup(snapshot_path, save_every)  # rekindle
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size, rk)  # rekindle
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, rk)  # rekindle
    trainer.train(total_epochs)
    rk.finalize()  # rekindle
    destroy_process_group()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('total_epochs', type=int, help='Total epochs to train the model')
    parser.add_argument('save_every', type=int, help='How often to save a snapshot')
    parser.add_argument('--batch_size', default=32, type=int, help='Input batch size on each device (default: 32)')
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size)
