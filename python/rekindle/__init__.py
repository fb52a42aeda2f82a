"""rekindle: data-parallel training that survives lost workers, from Python.

A pure-Python binding (ctypes) over librekindle.so: no extension to compile, any Python 3,
any torch version (or none: numpy arrays work too). docs/PYTHON.md describes it; the
C header include/rekindle.h is the reference for what each call does.

    import rekindle
    with rekindle.init(ckpt_dir="ckpt", ckpt_every=100) as rk:
        rk.register_module("model", model)
        rk.register_optimizer("optim", optimizer)
        step = rk.resume()
        while step < steps:
            try:
                loss = train_step(step)          # forward, backward
                rk.allreduce_gradients(model)    # average over the ring
                optimizer.step()
                rk.step_done(step)
                step += 1
            except rekindle.Recovered as r:      # a worker was lost; state rolled back
                step = r.next_step
"""
import atexit
import collections
import ctypes
import os
import weakref

from . import _lib, _tensor
from ._lib import Error, Recovered

__all__ = ["init", "load", "allreduce_hook", "Context", "Error", "Recovered", "SpareUnused", "Shard",
           "version", "RK_DEVICE", "RK_SHARDED", "RK_PER_RANK", "RK_FROZEN", "DEVICE", "SHARDED", "PER_RANK",
           "FROZEN"]

globals().update(_lib.CODES)  # rekindle.RK_E_TIMEOUT, ... from the library's table

# Flags of register() (include/rekindle.h, docs/SHARDING.md): SHARDED, this rank's slice
# of a global tensor along dimension 0; PER_RANK, state of this rank alone; DEVICE, CUDA
# memory (set by register() itself for a CUDA tensor; docs/GPU.md); FROZEN, with any of
# them: never changes after resume(), so snapshots copy it once (include/rekindle.h).
RK_DEVICE, RK_SHARDED, RK_PER_RANK, RK_FROZEN = 1, 2, 4, 8
DEVICE, SHARDED, PER_RANK, FROZEN = RK_DEVICE, RK_SHARDED, RK_PER_RANK, RK_FROZEN


# Context.shard_rows: this rank's slice of a sharded tensor, in rows of the global tensor.
Shard = collections.namedtuple("Shard", "offset rows global_rows")


class _HookError(Error, RuntimeError):
    """An Error raised inside a DDP communication hook, that is a RuntimeError too:
    torch 1.x turns an exception raised in a hook into a RuntimeError that carries its
    message, torch 2.x lets it through backward() as it is. Being both, it is caught by
    `except RuntimeError` under either (and by `except rekindle.Error` under 2.x)."""


class SpareUnused(Error):
    """From resume() on a spare worker (rekindle run --spares) that the job finished
    without: finalize and exit normally."""


def version():
    return _lib.lib.rk_version().decode()


_live = weakref.WeakSet()


@atexit.register
def _finalize_live():
    for ctx in list(_live):
        try:
            ctx.finalize()
        except Error:
            pass


def init(**options):
    """rk_init with the RK_* environment, each keyword overriding its variable:
    ckpt_dir, ckpt_every, snapshot_every, keep, heartbeat_ms, min_world, timeout_ms, event_log,
    det_iface, io, rollback, restore ("staged" or "inplace": rk_resume straight into the
    registered tensors, docs/FORMAT.md); and cuda_stream, the CUDA stream the program's GPU work runs
    on (a torch.cuda.Stream or its integer handle; default: the legacy default stream,
    PyTorch's default stream). Returns a Context (also a context manager that
    finalizes)."""
    o = _lib._Options()
    _lib.lib.rk_options_init(ctypes.byref(o))
    keep_alive = []
    for key, value in options.items():
        if key in _lib.STRING_OPTIONS:
            b = None if value is None else os.fsencode(value) if key == "ckpt_dir" else str(value).encode()
            keep_alive.append(b)
            setattr(o, key, b)
        elif key in _lib.INT_OPTIONS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError("rekindle.init: %s=%r: want an int" % (key, value))
            setattr(o, key, value)
        elif key == "cuda_stream":
            handle = getattr(value, "cuda_stream", value)
            if value is not None and (isinstance(handle, bool) or not isinstance(handle, int)):
                raise TypeError("rekindle.init: cuda_stream=%r: want a torch.cuda.Stream or an int handle" % (value,))
            o.cuda_stream = handle or None
        else:
            raise TypeError("rekindle.init: unknown option %r (known: %s)" % (
                key, ", ".join(_lib.STRING_OPTIONS + _lib.INT_OPTIONS + ("cuda_stream",))))
    handle = ctypes.c_void_p()
    _lib.call("rk_init", _lib.lib.rk_init(ctypes.byref(handle), ctypes.byref(o)))
    # rk_init removed the job secret from the C environment; Python's copy goes too, so
    # that subprocesses of this program do not inherit it.
    os.environ.pop("RK_JOB_SECRET", None)
    ctx = Context(handle, o.ckpt_dir is not None)
    _live.add(ctx)
    return ctx


class _Entry:
    __slots__ = ("name", "obj", "alias", "addr", "nbytes", "dtype", "shape", "flags")

    def take(self, tensor, addr, shape, nbytes):
        self.obj, self.addr, self.shape, self.nbytes = tensor, addr, shape, nbytes
        # A second reference to the same memory keeps it alive even if the tensor object's
        # storage is replaced later (the library may still write it during a recovery).
        self.alias = tensor.detach() if _tensor.is_torch(tensor) else tensor


class Context:
    """One worker's view of the job (rk_ctx). Made by rekindle.init()."""

    def __init__(self, handle, ckpt_on):
        self._h = handle
        self._ckpt_on = ckpt_on
        self._reg = []           # registration order: the checkpoint's and the hash's
        self._pending = None     # a recovery seen inside a DDP hook, not yet raised
        self._flat = {}          # allreduce_gradients' buffers, by dtype
        self._order = {}         # a registered tensor's address -> its registration index
        self._buckets = []       # DDP buckets of this backward pass, until the last one
        self._guarded = False    # an optimizer's step() raises a recovery a DDP hook saw

    # ---- life cycle -------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._h is None:
            return False
        try:
            self.finalize()
        except Error:
            if exc_type is None:
                raise
        return False

    def finalize(self):
        """rk_finalize: waits for checkpoints in flight (at most RK_TIMEOUT_MS), stops the
        detector, releases everything. Safe to call twice. An Error with name
        "RK_E_TIMEOUT" means a checkpoint writer is stuck on a disk that stopped
        answering: end the process with os._exit() after flushing output (HDF5's exit
        handler would wait for that writer)."""
        if self._h is None:
            return
        h, self._h = self._h, None
        _live.discard(self)
        self._reg.clear()
        _lib.call("rk_finalize", _lib.lib.rk_finalize(ctypes.byref(h)))

    def _handle(self):
        if self._h is None:
            raise Error(_lib.CODES["RK_E_STATE"], "this context was finalized", "rekindle")
        return self._h

    @property
    def rank(self):
        return _lib.lib.rk_rank(self._handle())

    @property
    def world(self):
        return _lib.lib.rk_world(self._handle())

    @property
    def next_step(self):
        return _lib.lib.rk_next_step(self._handle())

    # ---- registration -----------------------------------------------------------------
    def register(self, name, tensor, flags=0):
        """Registers a contiguous torch tensor (CPU or CUDA) or a C-contiguous numpy array
        under `name` (its path in the checkpoint). Its memory is checkpointed and restored
        in place: keep training on this very tensor (in-place updates, as optimizers do).
        A CUDA tensor (on the current device) is registered with DEVICE, set here: its
        snapshot is copied to pinned host memory while training goes on, and waited for
        before the next allreduce or step_done returns (docs/GPU.md).
        Rekindle keeps the memory alive; replacing the tensor's storage (`t.data = ...`,
        `load_state_dict` into a new tensor) is reported as an Error at the next call.
        flags: 0 (the same on every rank), SHARDED (this rank's rows of a global tensor;
        collective: every rank registers it, in the same order; see shard_rows and
        rebind for what a recovery changes) or PER_RANK."""
        addr, dtype, shape, nbytes = _tensor.describe(name, tensor)
        if _tensor.is_cuda(tensor):
            flags |= RK_DEVICE
        elif flags & RK_DEVICE:
            raise Error(-22, "tensor '%s': flag DEVICE on a tensor in host memory" % name, "register")
        c_shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        _lib.call("rk_register '%s'" % name,
                  _lib.lib.rk_register(self._handle(), name.encode(), addr or None, dtype, len(shape),
                                       c_shape, flags))
        e = _Entry()
        e.name, e.dtype, e.flags = name, dtype, flags
        e.take(tensor, addr, shape, nbytes)
        self._order.setdefault(addr, len(self._reg))
        self._reg.append(e)

    def _entry(self, name, what):
        for e in self._reg:
            if e.name == name:
                return e
        raise Error(-2, "no tensor '%s' is registered" % name, what)

    def shard_rows(self, name):
        """rk_shard_rows: the slice of sharded tensor `name` this rank holds now, as
        Shard(offset, rows, global_rows): its first row in the global tensor, its rows,
        the global tensor's rows. After a Recovered that changed the world, every sharded
        tensor is split evenly over the new members (rank r of W: G // W rows, one more if
        r < G % W, in rank order). A slice of the same size was restored into its tensor
        (its offset may have moved); one whose size changed must be handed a new tensor
        with rebind() before training goes on."""
        off, rows, total = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        _lib.call("rk_shard_rows '%s'" % name,
                  _lib.lib.rk_shard_rows(self._handle(), name.encode(), ctypes.byref(off), ctypes.byref(rows),
                                         ctypes.byref(total)))
        return Shard(off.value, rows.value, total.value)

    def rebind(self, name, tensor):
        """rk_rebind: registered tensor `name` is `tensor` from now on. For a sharded
        tensor whose slice changed size in a recovery: a new tensor of the new slice's
        shape (shard_rows(name).rows, then the trailing dimensions) and dtype, which
        receives the restored rows; train on it from then on. For any other tensor: one of
        the same dtype and shape, used from now on (nothing is copied into it)."""
        e = self._entry(name, "rebind")
        addr, dtype, shape, nbytes = _tensor.describe(name, tensor)
        want = self._shape_now(e)[0]
        if _tensor.is_cuda(tensor) != bool(e.flags & RK_DEVICE):
            raise Error(-22, "tensor '%s' was registered in %s memory: rebind it to a tensor there, not %s" % (
                name, "CUDA" if e.flags & RK_DEVICE else "host", tensor.device), "rebind")
        if dtype != e.dtype or shape != want:
            raise Error(-22, "tensor '%s': a %s tensor of shape %s, want %s of shape %s" % (
                name, _lib.DTYPE_NAMES[dtype], shape, _lib.DTYPE_NAMES[e.dtype], want), "rebind")
        _lib.call("rk_rebind '%s'" % name, _lib.lib.rk_rebind(self._handle(), name.encode(), addr or None))
        e.take(tensor, addr, shape, nbytes)
        self._order = {}
        for i, r in enumerate(self._reg):
            self._order.setdefault(r.addr, i)

    def _shape_now(self, e):
        """The shape registered tensor e has now, and for a sharded one its Shard: the
        library's slice, which a recovery (or a spare's resume) may have changed."""
        if not e.flags & RK_SHARDED:
            return e.shape, None
        s = self.shard_rows(e.name)
        return (s.rows,) + tuple(e.shape[1:]), s

    def register_module(self, prefix, module):
        """Registers every tensor of module.state_dict() (parameters and persistent
        buffers) as "<prefix>/<key>", so that rekindle.load(dir, prefix=prefix) gives a
        dict for module.load_state_dict(). The keys are the plain model's, whatever wraps
        it (as torch.distributed.checkpoint names them): a DistributedDataParallel's
        "module." and torch.compile's "_orig_mod." are left out, so a checkpoint of a
        compiled model loads into the model itself, and the other way round."""
        seen = {}
        for key, t in _unwrapped(module).state_dict(keep_vars=True).items():
            if t.data_ptr() in seen and t.numel():  # tied weights: the first name holds them
                continue
            seen[t.data_ptr()] = key
            self.register("%s/%s" % (prefix, ".".join(k for k in key.split(".") if k != "_orig_mod")), t)

    def register_optimizer(self, prefix, optimizer):
        """Registers the optimizer's state as "<prefix>/state/<i>/<key>" (i: the parameter's
        index in optimizer.state_dict()). State an optimizer creates lazily (Adam's moments
        and step) is created first, as it would be at its first step, then zeroed, so the
        first real step computes what it would have. Also makes optimizer.step() raise
        Recovered when a recovery happened inside a DDP communication hook (see
        allreduce_hook), so a step never applies a gradient of the lost membership."""
        _init_optimizer_state(optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            for key, value in optimizer.state.get(p, {}).items():
                name = "%s/state/%d/%s" % (prefix, i, key)
                if value is None:  # holds nothing (torch 1.13's SGD without momentum: momentum_buffer)
                    continue
                if not _tensor.is_torch(value):
                    raise Error(-22, "optimizer state '%s' is a %s, not a tensor: it cannot be "
                                "restored in place" % (name, type(value).__name__), "register_optimizer")
                self.register(name, value)
        self._guarded = True
        if hasattr(optimizer, "register_step_pre_hook"):
            optimizer.register_step_pre_hook(lambda *_: self._before_step())
        else:
            step = optimizer.step

            def guarded_step(*args, **kwargs):
                self._before_step()
                return step(*args, **kwargs)
            optimizer.step = guarded_step

    def _check_registered(self):
        for e in self._reg:
            addr = _tensor.address(e.obj)
            if addr != e.addr:
                raise Error(_lib.CODES["RK_E_STATE"],
                            "tensor '%s' was replaced since it was registered (its storage moved "
                            "from %#x to %#x): update registered tensors in place" % (e.name, e.addr, addr),
                            "rekindle")
            shape, s = self._shape_now(e)
            if shape != e.shape:
                raise Error(_lib.CODES["RK_E_STATE"],
                            "sharded tensor '%s' holds rows [%d, %d) of %d since the recovery, %d rows "
                            "where it held %d: hand a tensor of shape %s to rebind('%s', tensor)" % (
                                e.name, s.offset, s.offset + s.rows, s.global_rows, s.rows, e.shape[0],
                                shape, e.name), "rekindle")

    # ---- the training loop ------------------------------------------------------------
    def resume(self):
        """rk_resume: restores the latest consistent checkpoint into the registered
        tensors and returns the step to run next (0 without one). With restore="inplace"
        (RK_RESTORE) it reads straight into the tensors (CPU tensors only: no second copy
        of the state; on an error they may hold part of a checkpoint). A spare worker
        waits here until a loss brings it in (or raises SpareUnused)."""
        self._check_registered()
        step = ctypes.c_int64(0)
        rc = _lib.lib.rk_resume(self._handle(), ctypes.byref(step))
        if rc == _lib.CODES["RK_E_SPARE_UNUSED"]:
            raise SpareUnused(rc, _lib.last_error() or _lib.strerror(rc), "rk_resume")
        _lib.call("rk_resume", rc)
        return step.value

    def _before_step(self):
        """The registered optimizer's step() changes registered state: a recovery a DDP
        hook saw is raised first, then the last snapshot's copy is waited for (it is
        already done after the gradients' allreduce)."""
        self._raise_pending()
        self.before_update()

    def _raise_pending(self):
        if self._pending is not None:
            step, self._pending = self._pending, None
            raise Recovered(step)

    def _outcome(self, what, rc):
        if rc == _lib.RK_RECOVERED:
            raise Recovered(self.next_step)
        _lib.call(what, rc)

    def allreduce(self, tensor, op="avg"):
        """In place over the ring: op is "sum", "avg", "max" or "min". Raises Recovered
        when a member was lost (the registered state was rolled back)."""
        self._raise_pending()
        if op not in _lib.OPS:
            raise Error(_lib.CODES["RK_E_OP"], "op %r is not one of %s" % (op, ", ".join(_lib.OPS)), "allreduce")
        addr, dtype, shape, nbytes = _tensor.describe("allreduce buffer", tensor)
        count = _tensor.count(tensor)
        self._outcome("rk_allreduce", _lib.lib.rk_allreduce(self._handle(), addr or None, count, dtype,
                                                            _lib.OPS[op]))

    def allreduce_gradients(self, model, op="avg"):
        """Every gradient of model (parameters whose .grad is set; the same set on every
        rank) flattened into one buffer per device and dtype in parameter order, one
        allreduce each, copied back. CUDA gradients are reduced on the device (NCCL)."""
        self._reduce_flat([p.grad for p in model.parameters() if p.grad is not None], op)

    def _reduce_flat(self, grads, op):
        """grads (in the order that fixes the buffer's layout, so that every element is
        summed in the same order on every run) reduced as one flat buffer per dtype."""
        groups = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        for (device, dtype), group in groups.items():
            total = sum(g.numel() for g in group)
            flat = self._flat.get((device, dtype))
            if flat is None or flat.numel() != total:
                flat = self._flat[(device, dtype)] = _tensor.torch.empty(total, dtype=dtype, device=device)
            views, off = [], 0
            for g in group:
                v = flat[off:off + g.numel()]
                v.copy_(g.reshape(-1))
                views.append(v)
                off += g.numel()
            self.allreduce(flat, op)
            for g, v in zip(group, views):
                g.copy_(v.view_as(g))

    def before_update(self):
        """rk_before_update: waits until the last snapshot's copy is done, so that the
        registered state may change. Needed only by a program that changes registered
        state other than in the registered optimizer's step() after the gradients'
        allreduce (allreduce_gradients, the DDP hook, or allreduce): a data loader's
        position or an RNG advanced at the start of a step (docs/PYTHON.md)."""
        _lib.call("rk_before_update", _lib.lib.rk_before_update(self._handle()))

    def step_done(self, step):
        """rk_step_done: step `step` is finished; takes a checkpoint every ckpt_every
        steps (training waits for the copy only). Raises Recovered after a loss."""
        self._raise_pending()
        self._check_registered()
        self._outcome("rk_step_done", _lib.lib.rk_step_done(self._handle(), step))

    def checkpoint(self):
        """rk_checkpoint: a checkpoint of the current state now, labelled next_step."""
        self._check_registered()
        _lib.call("rk_checkpoint", _lib.lib.rk_checkpoint(self._handle()))

    def wait(self):
        """rk_wait: until every started checkpoint is committed or failed (at most
        RK_TIMEOUT_MS); raises the first failure since the last wait."""
        _lib.call("rk_wait", _lib.lib.rk_wait(self._handle()))

    def state_hash(self):
        """XXH64 (seed 0) of every registered tensor's bytes in registration order, as 16
        lowercase hex digits: the contract's `hash=` of the example trainers. A sharded
        tensor counts as its global tensor (every rank's slice in rank order), a per-rank
        tensor as every rank's piece in rank order, so every rank prints the same; with
        such state this is a collective (gathered over the ring) and may raise
        Recovered, like any other. CUDA tensors are copied to the host for it."""
        self._check_registered()
        chunks, keep = [], []
        for e in self._reg:
            if e.flags & RK_DEVICE:
                host = _tensor.host_bytes(e.obj)
                keep.append(host)
                chunks.append((host.data_ptr(), e.nbytes))
                continue
            if not e.flags & (RK_SHARDED | RK_PER_RANK):
                chunks.append((e.addr, e.nbytes))
                continue
            if e.flags & RK_SHARDED:
                s = self.shard_rows(e.name)
                row = _lib.DTYPE_SIZES[e.dtype]
                for d in e.shape[1:]:
                    row *= d
                at, total = s.offset * row, s.global_rows * row
            else:
                sizes = _tensor.np.zeros(self.world, dtype=_tensor.np.int64)
                sizes[self.rank] = e.nbytes
                self.allreduce(sizes, "max")
                at, total = int(sizes[:self.rank].sum()), int(sizes.sum())
            buf = _tensor.np.zeros(total, dtype=_tensor.np.uint8)
            if e.nbytes:
                ctypes.memmove(buf.ctypes.data + at, e.addr, e.nbytes)
            self.allreduce(buf, "max")  # zeros outside each rank's bytes: exact
            keep.append(buf)
            chunks.append((buf.ctypes.data, total))
        return "%016x" % _lib.xxh64(chunks)


def _unwrapped(module):
    """The model inside DistributedDataParallel and torch.compile wrappers (either order);
    a compiled submodule's keys still hold "_orig_mod", which register_module leaves out."""
    ddp = _tensor.torch.nn.parallel.DistributedDataParallel
    while True:
        if isinstance(module, ddp):
            module = module.module
        elif isinstance(getattr(module, "_orig_mod", None), _tensor.torch.nn.Module):
            module = module._orig_mod
        else:
            return module


def _init_optimizer_state(optimizer):
    """Creates an optimizer's lazily created state up front, as at its first step, without
    changing the parameters or the state the first real step will see: a step with zero
    gradients at learning rate 0, then every state tensor zeroed (Adam's step counter
    included)."""
    if any(optimizer.state.get(p) for g in optimizer.param_groups for p in g["params"]):
        return
    torch = _tensor.torch
    saved_grads, saved_lrs = [], []
    for g in optimizer.param_groups:
        for p in g["params"]:
            saved_grads.append(p.grad)
            p.grad = torch.zeros_like(p) if p.requires_grad else None
        saved_lrs.append(g.get("lr"))
        if "lr" in g:
            g["lr"] = 0.0
    with torch.no_grad():
        before = [p.detach().clone() for g in optimizer.param_groups for p in g["params"]]
        # The class's step, not a wrapper the instance holds: neither an averaging one
        # (rekindle.elastic.DistributedOptimizer: a collective) nor an LR scheduler's counter.
        type(optimizer).step(optimizer)
        i = 0
        for g, lr in zip(optimizer.param_groups, saved_lrs):
            if lr is not None:
                g["lr"] = lr
            for p in g["params"]:
                p.copy_(before[i])  # weight decay at lr 0 changes nothing, but be exact
                p.grad = saved_grads[i]
                i += 1
                for v in optimizer.state.get(p, {}).values():
                    if _tensor.is_torch(v):
                        v.zero_()


def allreduce_hook(state, bucket):
    """A DistributedDataParallel communication hook that averages the gradients over
    Rekindle's ring: ddp.register_comm_hook(rk, rekindle.allreduce_hook), with DDP built
    on a one-process gloo group and the module registered with rk.register_module.

    DDP hands over buckets whose layout changes after its first pass (it re-buckets in
    the order gradients became ready), and the ring's reduction order depends on an
    element's place in the buffer. So the hook keeps the buckets of a backward pass
    until the last one, then reduces every gradient at once in registration order, as
    rk.allreduce_gradients does: the same bits whatever DDP's bucketing, before or after
    a restart. A recovery inside the hook cannot be raised through backward() (DDP would
    be left half-reduced): it is remembered, and the registered optimizer's next step()
    (or the context's next call) raises Recovered. Without a registered optimizer nothing
    would stop step() from applying this rank's own, unreduced gradients to the
    rolled-back weights: the hook refuses to run (backward() raises a RuntimeError naming
    this Error)."""
    if not state._guarded:
        raise _HookError(_lib.CODES["RK_E_STATE"],
                         "no optimizer is registered (rk.register_optimizer): after a recovery inside "
                         "backward(), optimizer.step() would apply this rank's unreduced gradients to the "
                         "rolled-back weights", "allreduce_hook")
    torch = _tensor.torch
    fut = torch.futures.Future()
    state._buckets.append((bucket, fut))
    if not bucket.is_last():
        return fut
    buckets, state._buckets = state._buckets, []
    pairs = [(p, g) for b, _ in buckets for p, g in zip(b.parameters(), b.gradients())]
    unknown = len(state._order)
    pairs.sort(key=lambda pg: state._order.get(pg[0].data_ptr(), unknown))
    if state._pending is None:
        try:
            state._reduce_flat([g for _, g in pairs], "avg")
        except Recovered as r:
            state._pending = r.next_step
    for b, f in buckets:
        f.set_result(b.buffer() if hasattr(b, "buffer") else b.get_tensor())
    return fut


def _placer(map_location):
    """The function that moves a loaded CPU tensor where map_location says, as
    torch.load's map_location does; a checkpoint does not record the device a tensor was
    trained on, so every tensor's saved location is "cpu"."""
    torch = _tensor.torch
    bad = lambda why: Error(-22, "map_location=%r: %s" % (map_location, why), "load")
    if map_location is None:
        return lambda t: t
    if callable(map_location):
        def by_function(t):
            storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
            placed = map_location(storage, "cpu")
            if placed is None or placed is storage:
                return t
            return torch.empty(0, dtype=t.dtype, device=placed.device).set_(placed, 0, t.shape)
        return by_function
    if isinstance(map_location, dict):
        # Saved location -> device; a key naming another location matches no tensor here.
        where = next((v for k, v in map_location.items() if str(k) == "cpu"), None)
        if where is None:
            return lambda t: t
        map_location = where
    try:
        device = torch.device(map_location)
    except (RuntimeError, TypeError) as e:
        raise bad("not a device, a dict of devices or a function (%s)" % e)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise bad("no CUDA device here (torch.cuda.is_available() is False)")
    if device.type == "cpu":
        return lambda t: t
    return lambda t: t.to(device)


def load(ckpt_dir, step=None, prefix=None, as_numpy=False, map_location=None):
    """Every tensor of a committed checkpoint (the newest, or `step`) as a dict name ->
    torch.Tensor (numpy.ndarray with as_numpy=True or without torch; bf16 then comes as
    its raw uint16 bits), each checksum verified (Error RK_E_CORRUPT naming a damaged
    tensor). With prefix, only the names under
    "<prefix>/", with the prefix removed (for module.load_state_dict). Needs no job.
    map_location, as torch.load's: None or "cpu" (host tensors), a device ("cuda",
    "cuda:1", a torch.device), a dict mapping saved locations to devices, or a function
    (storage, location) -> storage. A checkpoint does not record where a tensor was
    trained, so every tensor's saved location is "cpu" (None: host tensors, where
    torch.load would put them back on their saved device)."""
    as_torch = _tensor.torch is not None and not as_numpy
    if map_location is not None and not as_torch:
        raise Error(-22, "map_location=%r: numpy arrays live in host memory (as_numpy=True or no torch)"
                    % (map_location,), "load")
    place = _placer(map_location) if as_torch else None
    r = ctypes.c_void_p()
    _lib.call("load %s" % os.fspath(ckpt_dir),
              _lib.lib.rk_reader_open(ctypes.byref(r), os.fsencode(ckpt_dir), -1 if step is None else step))
    try:
        out = {}
        info = _lib._TensorInfo()
        for i in range(_lib.lib.rk_reader_count(r)):
            _lib.call("load", _lib.lib.rk_reader_info(r, i, ctypes.byref(info)))
            name = info.name.decode()
            if prefix is not None:
                if not name.startswith(prefix + "/"):
                    continue
                name = name[len(prefix) + 1:]
            t = _tensor.empty(info.dtype, tuple(info.shape[:info.ndim]), as_torch)
            _lib.call("load '%s'" % name,
                      _lib.lib.rk_reader_read(r, i, _tensor.address(t) or None, info.nbytes))
            out[name] = place(t) if place else t
        return out
    finally:
        _lib.lib.rk_reader_close(ctypes.byref(r))


from . import backend  # noqa: E402,F401  torch.distributed's backend "rekindle" (docs/PYTHON.md)
