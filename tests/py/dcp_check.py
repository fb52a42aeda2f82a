"""tests/py/dcp_check.py BUILD WORK - rekindle.dcp.Writer / Reader under
torch.distributed.checkpoint's own planners, workers started here (gloo, a FileStore):

  1. 2 workers, a model under FSDP2 (fully_shard, Shard(0): each rank writes its rows)
     with Adam's state: dcp.save, then dcp.async_save of the next step's state, both
     through Writer (labels 0 and 1; keep=1 leaves only 1);
  2. the directory as Rekindle's: `rekindle verify` and `rekindle ls` (BUILD's command),
     h5py reads each weight whole (the virtual dataset over the ranks' pieces), and
     rekindle.load gives the same tensors;
  3. 3 workers, FSDP2 again (resharding 2 -> 3): dcp.load through Reader, set_state_dict;
     every full parameter and Adam moment equals the saved one;
  4. 1 process, the plain model (no process group): dcp.load of the model's state dict.
And rekindle.Error survives pickling (a worker's error crosses processes to be reported).
Prints "dcp_check: ok" at the end.
"""
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BUILD, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
CKPT = os.path.join(WORK, "ckpt")


def model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 6))


def reference():
    """The state after two steps of Adam on fixed data, on one process: what both saves
    and every load must show (the second save's)."""
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    for step in range(2):
        torch.manual_seed(100 + step)
        m(torch.randn(8, 12)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return m, opt


def sharded(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    m = model()
    fully_shard(m, mesh=init_device_mesh("cpu", (world,)))
    return m, torch.optim.Adam(m.parameters(), lr=0.01)


def worker(rank, world, phase):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    import rekindle.dcp
    store = dist.FileStore(os.path.join(WORK, "store-%s" % phase), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    m, opt = sharded(rank, world)
    if phase == "save":
        for step in range(2):
            torch.manual_seed(100 + step)
            m(torch.randn(8, 12)).square().mean().backward()  # the same batch everywhere
            opt.step()
            opt.zero_grad()
            msd, osd = get_state_dict(m, opt)
            sd = {"model": msd, "optim": osd}
            w = rekindle.dcp.Writer(CKPT, keep=1)
            if step == 0:
                dcp.save(sd, storage_writer=w)
            else:
                dcp.async_save(sd, storage_writer=w).result()
    else:
        msd, osd = get_state_dict(m, opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, storage_reader=rekindle.dcp.Reader(CKPT))
        set_state_dict(m, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        ref, ref_opt = reference()
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            full = p.full_tensor()
            if not torch.equal(full, q.detach()):
                raise SystemExit("dcp_check: %s differs after the load on %d ranks" % (name, world))
            st, rst = opt.state[p], ref_opt.state[q]
            for k in ("exp_avg", "exp_avg_sq"):
                if not torch.equal(st[k].full_tensor(), rst[k]):
                    raise SystemExit("dcp_check: Adam's %s of %s differs on %d ranks" % (k, name, world))
    dist.barrier()
    dist.destroy_process_group()


def run(argv):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    sys.stdout.write("$ %s\n%s" % (" ".join(argv), p.stdout))
    if p.returncode != 0:
        raise SystemExit("dcp_check: %s exited %d" % (" ".join(argv), p.returncode))
    return p.stdout


def main():
    import pickle
    import h5py
    import rekindle
    # A worker's failure reaches DCP's coordinator and mp.spawn pickled: rekindle.Error whole.
    e = pickle.loads(pickle.dumps(rekindle.Error(-1007, "no ncclX", "rekindle.dcp")))
    if (e.code, e.message, e.what, str(e)) != (-1007, "no ncclX", "rekindle.dcp", str(rekindle.Error(-1007, "no ncclX", "rekindle.dcp"))):
        raise SystemExit("dcp_check: rekindle.Error does not survive pickling: %r" % (e,))
    mp.spawn(worker, args=(2, "save"), nprocs=2)
    steps = sorted(os.listdir(CKPT))
    if steps != ["step-000000000001"]:
        raise SystemExit("dcp_check: want only step-000000000001 (keep=1), have %s" % steps)
    cli = os.path.join(BUILD, "bin", "rekindle")
    run([cli, "verify", CKPT])
    run([cli, "ls", CKPT])
    ref, _ = reference()
    loaded = rekindle.load(CKPT)
    with h5py.File(os.path.join(CKPT, steps[0], "index.h5"), "r") as f:
        for name, q in ref.state_dict().items():
            key = "model." + name
            if not (f[key][()] == q.numpy()).all() or not torch.equal(loaded[key], q):
                raise SystemExit("dcp_check: %s: h5py or rekindle.load differs from the saved tensor" % key)
    mp.spawn(worker, args=(3, "load"), nprocs=3)
    import torch.distributed.checkpoint as dcp
    import rekindle.dcp
    plain = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 6))
    sd = {"model": plain.state_dict()}
    dcp.load(sd, storage_reader=rekindle.dcp.Reader(CKPT))
    plain.load_state_dict(sd["model"])
    for (name, p), q in zip(plain.named_parameters(), ref.parameters()):
        if not torch.equal(p, q):
            raise SystemExit("dcp_check: %s differs after the load on one process" % name)
    print("dcp_check: ok")


if __name__ == "__main__":
    main()
