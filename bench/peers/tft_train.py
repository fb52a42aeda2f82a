"""bench/peers/tft_train.py - examples/torch_train.py's job (bench/peers/mlp.py) the way
TorchFT's own example (train_ddp.py) runs it: one replica group per worker, each started
by `torchrun --nproc-per-node 1 --max-restarts 1`, a Lighthouse the groups report to,
Manager + ProcessGroupGloo + torchft.DistributedDataParallel + torchft.Optimizer, the
state a replacement heals from a peer through PGTransport. Replica group g of G trains
on slice g of the global batch (as train_ddp.py's DistributedSampler by replica group):
the slices of a group that is away are not trained on.

    REPLICA_GROUP_ID=g NUM_REPLICA_GROUPS=G TORCHFT_LIGHTHOUSE=http://... \
      torchrun --nproc-per-node 1 --max-restarts 1 --master-port P tft_train.py STEPS HIDDEN [SEED]

Each group prints "step S committed|discarded participants N replica g t=<unix time>"
per step (the step number the Manager had when the step began) and at the end
"final step=N replica=g hash=<xxh64>"; "healed at step S" when it loaded a peer's state.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.nn as nn

from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlp  # noqa: E402


def main():
    steps, hidden = int(sys.argv[1]), int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    group, groups = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    mlp.setup()
    x, y = mlp.digits()
    batches = mlp.Batches(len(y), seed, 60)
    model = mlp.model(hidden, seed)
    healed = []

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        optimizer.load_state_dict(sd["optim"])
        healed.append(True)

    def state_dict():
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id="train_ddp_%d" % group, timeout=timedelta(seconds=30),
                      checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=10), device="cpu"))
    m = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, torch.optim.Adam(m.parameters(), lr=1e-3))
    loss_fn = nn.CrossEntropyLoss()
    while manager.current_step() < steps:
        step = manager.current_step()
        optimizer.zero_grad()  # starts the quorum
        idx = batches.slice(step, group, groups)
        loss = loss_fn(m(x[idx]), y[idx])
        loss.backward()
        optimizer.step()  # steps only if every participant's allreduce succeeded
        if healed:
            mlp.say("healed at step %d replica %d" % (step, group))
            healed.clear()
        mlp.say("step %d %s participants %d replica %d" % (
            step, "committed" if manager.current_step() > step else "discarded", manager.num_participants(), group))
    mlp.say("final step=%d replica=%d hash=%s" % (manager.current_step(), group,
                                                  mlp.state_hash(model, optimizer.optim)))
    manager.shutdown()


if __name__ == "__main__":
    main()
