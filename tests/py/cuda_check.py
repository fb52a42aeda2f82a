"""tests/py/cuda_check.py - the Python package on CUDA tensors (docs/GPU.md, docs/PYTHON.md),
run by tests/test_python_cuda.c on a machine with a GPU.

    cuda_check.py DIR write   registers CUDA tensors of several dtypes beside a CPU one
                              (DEVICE set by register() from tensor.is_cuda), allreduces
                              CUDA tensors and a CUDA model's gradients over the ring,
                              takes a checkpoint at every step while each step's update
                              is written right after an allreduce (the snapshot of step S
                              must hold step S's values, not S+1's), checks state_hash
                              against the host copies' bytes
    cuda_check.py DIR read    zeroed CUDA tensors of the same layout: resume() gives the
                              last step with every byte back on the device; rekindle.load
                              with map_location="cuda" and None
    cuda_check.py BUILD DIR train [--data FILE]
                              examples/torch_train.py --device cuda: the same final line
                              twice on one process and twice on 2 workers under
                              `rekindle run` (bitwise reproducible on the device)

Exit 0 when every check passed; a failed check raises (traceback, exit 1).
"""
import os
import re
import subprocess
import sys

import torch

import rekindle

STEPS = 6
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]


def device():
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def state(dev, step):
    """Every tensor's value at the end of `step` (-1: zeros), on dev; one host tensor."""
    out = {}
    for i, dt in enumerate(DTYPES):
        t = torch.zeros((257, 3 + i), dtype=dt, device=dev)
        if step >= 0:
            t.view(-1).copy_((torch.arange(t.numel(), device=dev) * 7 + step * 3 + i).remainder(100).to(dt))
        out["cuda/%s" % str(dt).split(".")[1]] = t
    out["host/steps"] = torch.full((5,), float(max(step, 0)), dtype=torch.float64)
    return out


def same(a, b):
    a, b = a.detach().cpu(), b.detach().cpu()
    return a.shape == b.shape and a.dtype == b.dtype and (
        a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def write(dir_):
    dev = device()
    rk = rekindle.init(ckpt_dir=dir_, ckpt_every=1, keep=STEPS + 1)
    W = rk.world
    s = state(dev, -1)
    for name, t in s.items():
        rk.register(name, t)
    flags = {e.name: e.flags for e in rk._reg}
    assert all(flags[n] & rekindle.DEVICE for n in s if n.startswith("cuda/")), flags
    assert not flags["host/steps"] & rekindle.DEVICE, flags
    assert rk.resume() == 0
    # Allreduce of CUDA tensors (NCCL, or pinned staging where NCCL cannot run).
    for dt in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
        t = torch.full((1000,), rk.rank + 1, dtype=dt, device=dev)
        rk.allreduce(t, "sum")
        assert torch.equal(t.cpu(), torch.full((1000,), W * (W + 1) // 2, dtype=dt)), (dt, t)
    # A CUDA model's gradients averaged: every rank ends with the mean of the ranks' own.
    model = torch.nn.Linear(16, 4).to(dev)
    x = torch.full((8, 16), float(rk.rank + 1), device=dev)
    model(x).sum().backward()
    own = model.weight.grad.clone()
    rk.allreduce_gradients(model)
    mine = torch.stack([own.cpu() / (rk.rank + 1) * (q + 1) for q in range(W)]).mean(0)
    assert torch.allclose(model.weight.grad.cpu(), mine), "allreduce_gradients on CUDA gradients"
    # Steps: the update of step S is written right after an allreduce (as an optimizer's
    # after the gradients'), while the snapshot of step S-1 may still be copying.
    dummy = torch.zeros(1 << 20, device=dev)
    for step in range(STEPS):
        rk.allreduce(dummy, "sum")
        want = state(dev, step)
        for name, t in s.items():
            t.copy_(want[name])
        rk.step_done(step)
    rk.wait()
    hosts = [rekindle._tensor.host_bytes(t) for t in s.values()]
    chunks = [(h.data_ptr(), h.numel() * h.element_size()) for h in hosts]
    assert rk.state_hash() == "%016x" % rekindle._lib.xxh64(chunks), "state_hash of CUDA tensors"
    # Each committed step holds that step's values, not the next one's.
    if rk.rank == 0:
        for step in range(STEPS):
            got = rekindle.load(dir_, step=step + 1)
            want = state("cpu", step)
            for name in want:
                assert same(got[name], want[name]), "checkpoint of step %d: %s" % (step + 1, name)
    rk.finalize()


def read(dir_):
    dev = device()
    with rekindle.init(ckpt_dir=dir_) as rk:
        if torch.cuda.device_count() > 1:  # a tensor on another device: an error naming it
            other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
            try:
                rk.register("elsewhere", torch.zeros(3, device="cuda:%d" % other))
                raise AssertionError("a tensor of another device was registered")
            except rekindle.Error as e:
                assert "one GPU per worker" in str(e), e
        s = state(dev, -1)
        for name, t in s.items():
            rk.register(name, t)
        assert rk.resume() == STEPS
        want = state(dev, STEPS - 1)
        for name in s:
            assert s[name].device == want[name].device and same(s[name], want[name]), name
        if rk.rank == 0:
            got = rekindle.load(dir_, map_location="cuda")
            assert all(got[n].is_cuda and same(got[n], want[n]) for n in want)
            got = rekindle.load(dir_)
            assert all(got[n].device.type == "cpu" and same(got[n], want[n]) for n in want)


def train(build, work, extra):
    src = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    prog = [sys.executable, os.path.join(src, "examples", "torch_train.py"), "--steps", "40", "--device", "cuda"]
    prog += extra
    env = {k: v for k, v in os.environ.items() if not k.startswith("RK_")}
    env["PYTHONPATH"] = os.path.join(src, "python")
    final = re.compile(r"^final step=40 world=(\d) hash=([0-9a-f]{16})$", re.M)
    seen = {}
    for n in (1, 2):
        for k in range(2):
            cmd = prog if n == 1 else [os.path.join(build, "bin", "rekindle"), "run", "-n", "2", "--"] + prog
            env["RK_CKPT_DIR"] = os.path.join(work, "ckpt-%d-%d" % (n, k))
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
            finals = final.findall(p.stdout)
            assert p.returncode == 0 and len(finals) == n and len(set(finals)) == 1, \
                "%d worker(s), run %d: exit %d\n%s" % (n, k, p.returncode, p.stdout[-3000:])
            seen.setdefault(n, set()).add(finals[0][1])
        assert len(seen[n]) == 1, "%d worker(s): two runs, two hashes %s" % (n, seen[n])


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("cuda_check: no CUDA device (torch.cuda.is_available() is False)")
        sys.exit(1)
    if len(sys.argv) >= 4 and sys.argv[3] == "train":
        train(sys.argv[1], sys.argv[2], sys.argv[4:])
        print("cuda_check train: ok")
    else:
        (write if sys.argv[2] == "write" else read)(sys.argv[1])
        print("cuda_check %s: ok" % sys.argv[2])
