"""bench/peers/dcp_train.py - examples/torch_train.py's job (bench/peers/mlp.py) the way
PyTorch's documentation has a job survive a lost worker: DistributedDataParallel over
Gloo, launched by `torchrun --max-restarts`, a checkpoint every EVERY steps with
torch.distributed.checkpoint.async_save of an AppState (get_state_dict / set_state_dict,
as in the DCP tutorial), and on every (re)start a load of the newest complete one.

    torchrun --nproc-per-node 4 --max-restarts 1 dcp_train.py DIR STEPS EVERY HIDDEN [SEED]

Rank 0 prints "step S loss L world W t=<unix time>" per step, "restored step S t=..."
after loading a checkpoint; every rank prints "final step=N world=W hash=<xxh64>".
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlp  # noqa: E402


class AppState(Stateful):
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.step = torch.zeros((), dtype=torch.int64)

    def state_dict(self):
        m, o = get_state_dict(self.model, self.optimizer)
        return {"model": m, "optim": o, "step": self.step}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.step.copy_(sd["step"])


def newest(root):
    """The newest complete checkpoint (its .metadata is written last), or None."""
    done = [int(d[5:]) for d in os.listdir(root) if d.startswith("step-") and
            os.path.exists(os.path.join(root, d, ".metadata"))]
    return max(done) if done else None


def main():
    root, steps, every, hidden = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    mlp.setup()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = mlp.digits()
    batches = mlp.Batches(len(y), seed, 60)
    model = mlp.model(hidden, seed)
    ddp = nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    app = AppState(model, optim)
    # async_save's collectives run in a thread beside training's: on a group of their own
    # (training's DDP allreduces on the default group would interleave with them).
    ckpt_group = dist.new_group(backend="gloo")
    os.makedirs(root, exist_ok=True)
    dist.barrier()
    step = 0
    last = newest(root)
    if last is not None:
        dcp.load({"app": app}, checkpoint_id=os.path.join(root, "step-%d" % last))
        step = int(app.step)
        if rank == 0:
            mlp.say("restored step %d" % step)
    pending = None
    while step < steps:
        optim.zero_grad(set_to_none=False)
        idx = batches.slice(step, rank, world)
        loss = loss_fn(ddp(x[idx]), y[idx])
        loss.backward()
        optim.step()
        lv = loss.detach().clone()
        dist.all_reduce(lv)
        if rank == 0:
            mlp.say("step %d loss %.6g world %d" % (step, lv.item() / world, world))
        step += 1
        if every and step % every == 0:
            if pending is not None:
                pending.result()
            app.step.fill_(step)
            pending = dcp.async_save({"app": app}, checkpoint_id=os.path.join(root, "step-%d" % step),
                                     process_group=ckpt_group)
    if pending is not None:
        pending.result()
    mlp.say("final step=%d world=%d hash=%s" % (step, world, mlp.state_hash(model, optim)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
