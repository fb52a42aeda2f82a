"""bench/torch_ddp.py - a DDP training step with its gradients averaged by
rekindle.allreduce_hook over Rekindle's ring, against the same DDP model over a real
gloo process group of the same ranks (torch's own allreduce, its 25 MiB buckets
overlapping the backward pass). Started by bench/torch.sh under mpirun:

    mpirun -n N python3 torch_ddp.py rekindle|gloo PORT

Prints from rank 0: "ddp MODE ranks N params P step_ms M" (median over steps of the
slowest rank's forward + backward + reduction).
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

MODE, PORT = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1024))
x = torch.randn(8, 1024)
STEPS, WARM = 15, 3

if MODE == "rekindle":
    import rekindle
    rk = rekindle.init()
    rk.register_module("model", model)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(rk, rekindle.allreduce_hook)
    sync = lambda t: rk.allreduce(t, "max")  # noqa: E731
else:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ddp = nn.parallel.DistributedDataParallel(model)
    sync = lambda t: dist.all_reduce(t, op=dist.ReduceOp.MAX)  # noqa: E731

times = []
for i in range(STEPS + WARM):
    sync(torch.zeros(1))  # start together
    t0 = time.perf_counter()
    ddp(x).sum().backward()
    t = torch.tensor([time.perf_counter() - t0])
    sync(t)  # the slowest rank's time
    if i >= WARM:
        times.append(t.item())
    model.zero_grad()
if rank == 0:
    n = sum(p.numel() for p in model.parameters())
    print("ddp %s ranks %d params %d step_ms %.2f" % (MODE, world, n, 1e3 * statistics.median(times)), flush=True)
if MODE == "rekindle":
    rk.finalize()
