"""tests/py/api_check.py - the Python binding's API, run by tests/test_python.c on one
process and on 3 ranks under mpirun.

    api_check.py DIR write   registers one tensor of every dtype (torch and numpy), a
                             sharded and a per-rank one, checks allreduce, shard_rows,
                             rebind, the gathered state_hash, the errors for bad tensors
                             and options, the DDP hook's refusal without a registered
                             optimizer, checkpoints the state as step 7
    api_check.py DIR read    registers zeroed tensors of the same layout, resume() gives
                             step 7 with every byte back; rekindle.load gives the same
    api_check.py DIR read-inplace   the same with init(restore="inplace"): resume() reads
                             straight into the registered tensors (docs/FORMAT.md)
    api_check.py DIR wrapped register_module of models inside DDP and torch.compile:
                             the checkpoint holds the plain model's names

Exit 0 when every check passed; a failed check raises (traceback, exit 1).
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

import rekindle

DIR, MODE = sys.argv[1], sys.argv[2]
TORCH = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
NUMPY = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]


def state(fill):
    """One tensor per dtype, odd sizes, a 0-dim one and an empty one."""
    out = {}
    for i, dt in enumerate(TORCH):
        t = torch.zeros((3, 5 + i), dtype=dt)
        if fill:
            t.view(-1).copy_(torch.arange(t.numel()).to(dt) + i)
        out["torch/%s" % str(dt).split(".")[1]] = t
    for i, dt in enumerate(NUMPY):
        a = np.zeros((7 + i,), dtype=dt)
        if fill:
            a[:] = np.arange(a.size) * 3 + i
        out["numpy/%s" % np.dtype(dt).name] = a
    out["scalar"] = torch.tensor(42.5 if fill else 0.0, dtype=torch.float64)
    out["empty"] = torch.zeros((0, 4))
    return out


GLOBAL_ROWS = 10  # of the sharded tensor "shard/rows", 3 columns: row i holds i, i+.25, i+.5


def own(rk, fill):
    """This rank's slice of "shard/rows" (the even split) and its per-rank "rank/ids"
    (rank + 1 int32 values, all rank + 7)."""
    W, r = rk.world, rk.rank
    rows = GLOBAL_ROWS // W + (r < GLOBAL_ROWS % W)
    off = r * (GLOBAL_ROWS // W) + min(r, GLOBAL_ROWS % W)
    sh = torch.zeros((rows, 3), dtype=torch.float32)
    ids = np.zeros(r + 1, dtype=np.int32)
    if fill:
        sh.copy_(global_rows()[off:off + rows])
        ids[:] = r + 7
    return off, sh, ids


def global_rows():
    return torch.arange(GLOBAL_ROWS, dtype=torch.float32).reshape(-1, 1) + torch.tensor([0.0, 0.25, 0.5])


def same(a, b):
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def expect_error(what, fn, name=None, contains=None):
    try:
        fn()
    except rekindle.Error as e:
        want = (name,) if isinstance(name, str) else name
        assert name is None or e.name in want, "%s: got %s, want %s" % (what, e.name, name)
        assert e.message, what
        assert contains is None or contains in str(e), "%s: %r does not say %r" % (what, str(e), contains)
        return
    raise AssertionError("%s: no rekindle.Error" % what)


def write():
    os.environ["RK_JOB_SECRET"] = "5a" * 32
    rk = rekindle.init(ckpt_dir=DIR, ckpt_every=0)
    W = rk.world
    # The job secret is gone from both environments: children do not inherit it.
    assert "RK_JOB_SECRET" not in os.environ
    assert subprocess.run(["sh", "-c", 'test -z "$RK_JOB_SECRET"']).returncode == 0
    # Options: a bad keyword, a bad value (named by the library).
    try:
        rekindle.init(nonsense=1)
        raise AssertionError("unknown option accepted")
    except TypeError as e:
        assert "nonsense" in str(e)
    s = state(True)
    for name, t in s.items():
        rk.register(name, t)
    # Bad tensors: each a clear error naming the tensor.
    expect_error("non-contiguous", lambda: rk.register("bad/t", torch.zeros(4, 4).t()))
    expect_error("bool dtype", lambda: rk.register("bad/b", torch.zeros(3, dtype=torch.bool)))
    expect_error("complex numpy", lambda: rk.register("bad/c", np.zeros(3, dtype=np.complex64)))
    ro = np.zeros(3)
    ro.setflags(write=False)
    expect_error("read-only array", lambda: rk.register("bad/r", ro))
    expect_error("a list", lambda: rk.register("bad/l", [1.0, 2.0]))
    expect_error("duplicate name", lambda: rk.register("scalar", torch.zeros(1)), "RK_E_DUPLICATE")
    expect_error("bad name", lambda: rk.register("a//b", torch.zeros(1)), "RK_E_NAME")
    # DEVICE is register()'s to set, from tensor.is_cuda: asked for on host memory, an error.
    expect_error("device flag", lambda: rk.register("flagged", torch.zeros(1), flags=rekindle.DEVICE),
                 contains="flag DEVICE on a tensor in host memory")
    # A tensor on a device other than the CPU and CUDA (the meta device has no memory).
    expect_error("meta tensor", lambda: rk.register("bad/m", torch.zeros(3, device="meta")),
                 contains="Rekindle takes CPU and CUDA tensors")
    expect_error("restore value", lambda: rekindle.init(restore="direct"), "RK_E_OPTION",
                 contains="RK_RESTORE")
    try:
        rekindle.init(cuda_stream="default")
        raise AssertionError("cuda_stream='default' accepted")
    except TypeError as e:
        assert "cuda_stream" in str(e)
    expect_error("two kinds", lambda: rk.register("flagged", torch.zeros(1),
                                                  flags=rekindle.SHARDED | rekindle.PER_RANK))
    # Sharded and per-rank state: the slice's place, rebind, the gathered hash.
    off, sh, ids = own(rk, True)
    rk.register("shard/rows", sh, rekindle.SHARDED)
    rk.register("rank/ids", ids, rekindle.PER_RANK)
    assert rk.shard_rows("shard/rows") == (off, sh.shape[0], GLOBAL_ROWS), rk.shard_rows("shard/rows")
    assert rk.shard_rows("shard/rows").global_rows == GLOBAL_ROWS
    expect_error("shard_rows of a replicated tensor", lambda: rk.shard_rows("scalar"))
    expect_error("rebind to another shape", lambda: rk.rebind("shard/rows", torch.zeros((sh.shape[0] + 1, 3))))
    expect_error("rebind to another dtype", lambda: rk.rebind("shard/rows", torch.zeros(sh.shape, dtype=torch.float64)))
    expect_error("rebind of an unknown name", lambda: rk.rebind("absent", torch.zeros(1)))
    moved = sh.clone()
    rk.rebind("shard/rows", moved)  # from now on the checkpoint reads `moved`
    sh.fill_(-1)
    s["shard/rows"] = moved
    s["rank/ids"] = ids
    assert rk.resume() == 0
    # allreduce over the ring, each dtype.
    for dt in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
        t = torch.full((5,), rk.rank + 1, dtype=dt)
        rk.allreduce(t, "sum")
        assert torch.equal(t, torch.full((5,), W * (W + 1) // 2, dtype=dt)), (dt, t)
    a = np.full(9, float(rk.rank), dtype=np.float32)
    rk.allreduce(a, "max")
    assert (a == W - 1).all()
    expect_error("bad op", lambda: rk.allreduce(torch.zeros(2), "prod"), "RK_E_OP")
    expect_error("avg of ints", lambda: rk.allreduce(torch.zeros(2, dtype=torch.int32), "avg"))
    for k in range(7):
        rk.step_done(k)
    assert rk.next_step == 7
    rk.checkpoint()
    rk.wait()
    h = rk.state_hash()
    # The hash covers the global sharded tensor and every rank's per-rank piece in rank
    # order, so every rank gets the same one.
    everyone = np.concatenate([np.full(q + 1, q + 7, dtype=np.int32) for q in range(W)])
    full = global_rows()
    chunks = [(rekindle._tensor.address(t), rekindle._tensor.describe(n, t)[3]) for n, t in s.items()
              if n not in ("shard/rows", "rank/ids")]
    chunks += [(full.data_ptr(), full.numel() * 4), (everyone.ctypes.data, everyone.nbytes)]
    assert h == "%016x" % rekindle._lib.xxh64(chunks), "state_hash does not cover the gathered state"
    # A DDP hook with no optimizer registered refuses to run: after a recovery in it,
    # nothing would stop optimizer.step() from applying unreduced gradients.
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    ddp.register_comm_hook(rk, rekindle.allreduce_hook)
    try:
        ddp(torch.ones(2, 3)).sum().backward()
        raise AssertionError("allreduce_hook ran without a registered optimizer")
    except RuntimeError as e:  # torch 1.x wraps the hook's exception, 2.x passes it through
        assert "no optimizer is registered" in str(e), e
        assert isinstance(e, rekindle.Error) or torch.__version__ < "2", type(e)
    # A tensor whose storage is replaced: an error at the next call, naming it.
    s["torch/float32"].data = torch.zeros(3, 5)
    expect_error("replaced storage", lambda: rk.step_done(7), "RK_E_STATE")
    rk.finalize()
    rk.finalize()  # twice is fine
    expect_error("after finalize", lambda: rk.rank, "RK_E_STATE")
    expect_error("a second init", lambda: rekindle.init(), "RK_E_STATE")  # MPI starts once
    with open(os.path.join(DIR, "hash-%d" % W), "w") as f:
        f.write(h)


def read(restore="staged"):
    with rekindle.init(ckpt_dir=DIR, restore=restore) as rk:
        s = state(False)
        for name, t in s.items():
            rk.register(name, t)
        _, s["shard/rows"], s["rank/ids"] = own(rk, False)
        rk.register("shard/rows", s["shard/rows"], rekindle.SHARDED)
        rk.register("rank/ids", s["rank/ids"], rekindle.PER_RANK)
        assert rk.resume() == 7
        want = state(True)
        _, want["shard/rows"], want["rank/ids"] = own(rk, True)
        for name in s:
            assert same(s[name], want[name]), name
        with open(os.path.join(DIR, "hash-%d" % rk.world)) as f:
            assert rk.state_hash() == f.read()
        if rk.rank == 0:
            got = rekindle.load(DIR)
            # On disk a sharded tensor is its global tensor, per-rank state each rank's.
            want["shard/rows"] = global_rows()
            del want["rank/ids"]
            for q in range(rk.world):
                want["ranks/%d/rank/ids" % q] = np.full(q + 1, q + 7, dtype=np.int32)
            assert sorted(got) == sorted(want), sorted(got)
            for name, t in want.items():
                g = got[name]
                if isinstance(t, np.ndarray):
                    g = g.numpy()
                assert same(g, t), name
            np_got = rekindle.load(DIR, step=7, as_numpy=True)
            assert np_got["torch/bfloat16"].dtype == np.uint16
            assert np_got["numpy/int32"].tobytes() == want["numpy/int32"].tobytes()
            sub = rekindle.load(DIR, prefix="torch")
            assert sorted(sub) == sorted(n[len("torch/"):] for n in want if n.startswith("torch/"))
            map_location_checks(want)
            expect_error("no such step", lambda: rekindle.load(DIR, step=8), "RK_E_NOCKPT")
            expect_error("no such dir", lambda: rekindle.load(os.path.join(DIR, "absent")))
            damaged_load_names_the_tensor(want["numpy/float64"], "numpy/float64")


def damaged_load_names_the_tensor(t, name):
    """rekindle.load of a copy of the checkpoint with one byte of tensor `name` changed on
    disk (found by its bytes in the shard files) fails with RK_E_CORRUPT naming it."""
    bad = DIR.rstrip("/") + "-damaged"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(DIR, bad)
    key, hits = t.tobytes(), []
    for root, _, files in os.walk(bad):
        for f in files:
            if f.startswith("shard-"):
                with open(os.path.join(root, f), "rb") as fh:
                    data = fh.read()
                hits += [(os.path.join(root, f), data.find(key))] if data.count(key) == 1 else []
    assert len(hits) == 1, "the bytes of %s are not in one shard file once: %s" % (name, hits)
    path, off = hits[0]
    with open(path, "r+b") as fh:
        fh.seek(off + len(key) // 2)
        b = fh.read(1)
        fh.seek(off + len(key) // 2)
        fh.write(bytes([b[0] ^ 0x40]))
    expect_error("a damaged tensor", lambda: rekindle.load(bad, step=7), "RK_E_CORRUPT", contains=name)
    shutil.rmtree(bad)


def map_location_checks(want):
    """rekindle.load(map_location=...) as torch.load's: devices, dicts of saved location
    -> device, functions (storage, location) -> storage; every saved location is "cpu"."""
    seen = []

    def keep(storage, location):
        seen.append(location)
        return storage

    def default(storage, location):
        return None

    for where in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, {"cuda:0": "cuda:1"}, keep, default):
        got = rekindle.load(DIR, step=7, map_location=where)
        for name, t in want.items():
            if isinstance(t, torch.Tensor):
                assert got[name].device.type == "cpu" and same(got[name], t), (where, name)
    assert seen and set(seen) == {"cpu"}, seen
    expect_error("not a device", lambda: rekindle.load(DIR, map_location="nowhere"), contains="map_location='nowhere'")
    expect_error("numpy on a device", lambda: rekindle.load(DIR, as_numpy=True, map_location="cuda"),
                 contains="host memory")
    if torch.cuda.is_available():
        got = rekindle.load(DIR, map_location="cuda")
        assert got["torch/float32"].is_cuda and same(got["torch/float32"].cpu(), want["torch/float32"])
    else:
        expect_error("cuda without a device", lambda: rekindle.load(DIR, map_location="cuda"),
                     contains="no CUDA device here")


def wrapped():
    """register_module of a model wrapped in DistributedDataParallel, in torch.compile
    (where this torch has it), in both, and with a compiled submodule: the checkpoint
    holds the plain model's names, and rekindle.load(prefix=...) loads into a plain model."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def make():
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    with rekindle.init(ckpt_dir=DIR, ckpt_every=0) as rk:
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        torch.manual_seed(1)
        models = {"ddp": make()}
        net = {"ddp": DDP(models["ddp"])}
        if hasattr(torch, "compile"):
            models["compiled"], models["both"], models["inner"] = make(), make(), make()
            net["compiled"] = torch.compile(models["compiled"], backend="eager")
            net["both"] = torch.compile(DDP(models["both"]), backend="eager")
            models["inner"][0] = torch.compile(models["inner"][0], backend="eager")
            net["inner"] = models["inner"]
        for name, m in net.items():
            rk.register_module(name, m)
        rk.resume()
        rk.checkpoint()
        rk.wait()
        for name, m in models.items():
            got, plain = rekindle.load(DIR, prefix=name), make()
            assert sorted(got) == sorted(plain.state_dict()), (name, sorted(got))
            plain.load_state_dict(got)
            for a, b in zip(plain.state_dict().values(), m.state_dict().values()):
                assert torch.equal(a, b), name


{"write": write, "read": read, "read-inplace": lambda: read("inplace"), "wrapped": wrapped}[MODE]()
print("api_check %s: ok" % MODE)
