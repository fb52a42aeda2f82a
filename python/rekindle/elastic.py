"""rekindle.elastic: Horovod Elastic's API (horovod.torch.elastic) on Rekindle's recovery.

A program written for Elastic Horovod runs on Rekindle with its names changed:

    import rekindle.elastic as elastic

    elastic.init()                                   # hvd.init()
    optimizer = elastic.DistributedOptimizer(optimizer)

    @elastic.run                                     # @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    state = elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])
    train(state)

What maps to what (docs/PYTHON.md, "Horovod Elastic API"):

- TorchState registers the model (register_module), the optimizer (register_optimizer)
  and every scalar (int, float, bool) as a 0-dimensional tensor with Rekindle, so all of
  it is in Rekindle's snapshots and rolls back together after a loss.
- commit() is rk_step_done: the snapshot in memory that a recovery rolls back to (and a
  checkpoint on disk every RK_CKPT_EVERY commits). One commit is one Rekindle step.
- A lost worker makes the survivors' next collective call raise rekindle.Recovered with
  the state already rolled back to the last commit they all hold (what Horovod's
  restore() does after a HorovodInternalError); run() then calls the reset callbacks and
  the function again.
- The job growing in place (`rekindle run --spares S`, then RK_RUN_DIR/grow: spares held
  back at launch join the ring, docs/LAUNCHER.md) makes every member's next collective
  call of this module (commit(), check_host_updates(), sync(), DistributedOptimizer's
  step()) raise HostsUpdatedInterrupt, a Recovered whose ring is larger than before: the
  state is the last commit every worker holds (from their memory: no step of theirs is
  trained again from a checkpoint on disk) and the joining workers received it. run() catches it as it catches a loss: the reset
  callbacks, then the function again, without a sync; a joining spare's run() starts
  there, after its reset callbacks.
- sync() gives every worker rank 0's state (rk_broadcast: an exact byte-wise broadcast
  over the ring).
- restore() from user code is not available: the library keeps the snapshot, and rolls
  back only on a loss or a growth (rekindle.Error, RK_E_NOTAVAIL).
- ElasticSampler (hvd.elastic.ElasticSampler) given to TorchState rolls back with it:
  after a loss or a growth the rest of the epoch is shared out again over the workers
  there are now, each sample still taken once.
- `rekindle run --host-discovery-script` (and `--grow relaunch`) grows a job by launching
  it again from a checkpoint, which the first call of the run() function resumes.
"""
import functools
import numbers

from . import _lib, _tensor
from . import init as _init
from ._lib import Error, Recovered

__all__ = ["init", "shutdown", "context", "rank", "size", "run", "TorchState", "DistributedOptimizer",
           "ElasticSampler", "HostsUpdatedInterrupt"]

_ctx = None


class HostsUpdatedInterrupt(Recovered):
    """hvd.elastic.HostsUpdatedInterrupt: the ring grew while a collective call of this
    module ran (commit(), check_host_updates(), sync(), DistributedOptimizer's step()):
    spares held back at launch joined in place (rekindle run --spares, RK_RUN_DIR/grow).
    Every registered tensor is at the last commit every worker holds, from the workers'
    memory, and the joining workers received it; continue from `next_step` at size() (run()
    does: the reset callbacks, then the function again). skip_sync is True: run() calls
    sync() only at its first call, never after a growth (Horovod's syncs here unless only
    hosts were removed). A Recovered, so a program that catches Recovered catches this too;
    a ring that is not larger after the recovery (a lost member, even one a spare replaced,
    or a spare lost while joining) is a plain Recovered."""

    def __init__(self, next_step, skip_sync=True):
        super().__init__(next_step)
        self.skip_sync = skip_sync
        self.args = ("hosts updated: the ring grew to %d workers; continue from step %d" % (
            _ctx.world if _ctx is not None and _ctx._h is not None else -1, next_step),)


def _collective(call, *args):
    """call(*args), a collective of the context; a Recovered it raises becomes a
    HostsUpdatedInterrupt when the ring is larger after it than before."""
    world = context().world
    try:
        return call(*args)
    except HostsUpdatedInterrupt:
        raise
    except Recovered as r:
        if context().world > world:
            raise HostsUpdatedInterrupt(r.next_step).with_traceback(r.__traceback__) from None
        raise


def init(**options):
    """hvd.init(): rekindle.init(**options) once per process (a second call returns the
    same context). Options as rekindle.init's; RK_CKPT_DIR (or ckpt_dir=) is needed for
    commits to be held at all (without it a lost worker ends the job)."""
    global _ctx
    if _ctx is None or _ctx._h is None:
        _ctx = _init(**options)
    return _ctx


def shutdown():
    """hvd.shutdown(): finalizes the context (rekindle.Context.finalize)."""
    if _ctx is not None:
        _ctx.finalize()


def context():
    """The rekindle.Context that init() made: for anything beyond Horovod's API
    (allreduce, state_hash, ...)."""
    if _ctx is None or _ctx._h is None:
        raise Error(_lib.CODES["RK_E_STATE"], "call rekindle.elastic.init() first", "rekindle.elastic")
    return _ctx


def rank():
    """hvd.rank(): this worker's rank in the current ring (renumbered after a loss; -1 for
    a spare not yet brought in)."""
    return context().rank


def size():
    """hvd.size(): the ring's size now."""
    return context().world


def run(func):
    """@hvd.elastic.run: calls func(state, *args, **kwargs). The first call synchronizes
    the state (sync(): rank 0's everywhere) and resumes the newest checkpoint on disk if
    there is one (a relaunched job goes on from it). When a worker is lost, the survivors'
    next collective call raises rekindle.Recovered with every registered tensor (the
    state's scalars too) already rolled back to the last commit they all hold: the reset
    callbacks run, then func is called again with the same state. A growth in place
    (HostsUpdatedInterrupt, a Recovered) is handled alike: nothing to restore (the state is
    the last commit every worker holds, from memory), no sync (the joining workers
    received it), the reset callbacks at the new size(), func again. A loss during the first
    call's sync is retried alike (the survivors sync and resume again at the new size,
    then the reset callbacks run) where the job has a checkpoint on disk to roll back to
    (one launched again); a job's very first launch has none yet: rekindle.Error
    (RK_E_NOCKPT) ends it. A spare worker (rekindle
    run --spares) that a loss brings in runs the reset callbacks once before its first
    call: its rank and world are known only then; so does one that a growth in place
    brings in (it then starts func with the others' state at the step they go on from).

    Every other exception propagates, rekindle.Error included: a recovery that cannot
    go on (RK_E_MIN_WORLD, RK_E_NO_MAJORITY, RK_E_PEER_LOST, ...) ends the call, never
    another try. Each retry follows a recovery that succeeded, each of those followed the
    loss of a worker or the arrival of a spare, so the retries are bounded by the number
    of workers launched."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        reset = False
        while True:
            try:
                # A loss during the first call's sync is a recovery like any other: the
                # start (sync, resume) is made again at the new size, then the reset.
                state._start()
                if reset:
                    state._on_reset()
                return func(state, *args, **kwargs)
            except Recovered:
                reset = True
    return wrapper


def DistributedOptimizer(optimizer, named_parameters=None):
    """hvd.DistributedOptimizer: the same optimizer, whose step() first averages its
    parameters' gradients over the ring (flattened in the optimizer's parameter order, one
    allreduce per device and dtype, as rk.allreduce_gradients). named_parameters is
    accepted as Horovod's and not needed (Horovod names its allreduces with it). Horovod's
    compression, op, backward_passes_per_step and process sets are not offered."""
    ctx = context()
    if getattr(optimizer, "_rekindle_averaged", False):
        return optimizer
    params = [p for g in optimizer.param_groups for p in g["params"]]
    step = optimizer.step

    def averaged_step(*args, **kwargs):
        _collective(ctx._reduce_flat, [p.grad for p in params if p.grad is not None], "avg")
        return step(*args, **kwargs)
    optimizer.step = averaged_step
    optimizer._rekindle_averaged = True
    return optimizer


class ElasticSampler:
    """hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0): a sampler for a DataLoader
    that shares out the samples of an epoch not yet processed over the workers there are
    now, and rolls back with the state. Given to TorchState (`TorchState(model, optimizer,
    train_sampler=sampler)`), its epoch and its count of the epoch's samples processed by
    all workers together are registered with the rest ("elastic/<name>/epoch",
    "elastic/<name>/processed"), so a loss rolls them back to the last commit, and the next
    iteration (the run() function called again) shares out the rest over the survivors.

    An epoch's order is a permutation of range(len(dataset)) drawn from seed + epoch
    (torch.randperm; the identity without shuffle), the same on every worker. Of the
    samples not yet processed, worker r of W takes every W-th from the r-th (as
    DistributedSampler, padded with the first ones so every worker takes as many), so
    after k batches of b samples on every worker the first k * b * W of them are the ones
    processed: record_batch(batch_idx, batch_size), called by every worker after each
    batch, is all it needs to know. set_epoch(epoch) starts an epoch (nothing processed).
    Horovod's record_indices (a set of indices per worker, merged at sync) is not offered:
    every worker processes the same number of samples a step here."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self._epoch, self._processed = 0, 0  # plain ints until a TorchState registers them
        self._t = None                       # (ctx, epoch tensor, processed tensor) once registered
        self._base = 0                       # samples processed when the current iteration began

    # ---- the two values that roll back ------------------------------------------------
    def _get(self, i):
        return int(self._t[1 + i].item()) if self._t else (self._epoch, self._processed)[i]

    def _set(self, i, value):
        if self._t:
            self._t[0].before_update()  # the last commit's snapshot may still be copying it
            self._t[1 + i].fill_(value)
        elif i == 0:
            self._epoch = value
        else:
            self._processed = value

    def _register(self, ctx, name):
        torch = _tensor.torch
        epoch = torch.tensor(self._epoch, dtype=torch.int64)
        processed = torch.tensor(self._processed, dtype=torch.int64)
        ctx.register("elastic/%s/epoch" % name, epoch)
        ctx.register("elastic/%s/processed" % name, processed)
        self._t = (ctx, epoch, processed)

    @property
    def epoch(self):
        return self._get(0)

    @property
    def processed(self):
        """Samples of this epoch processed by all workers together."""
        return self._get(1)

    # ---- Horovod's sampler --------------------------------------------------------------
    def set_epoch(self, epoch):
        """Starts epoch `epoch`: its own order, nothing processed."""
        self._set(0, int(epoch))
        self._set(1, 0)
        self._base = 0

    def _order(self):
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        torch = _tensor.torch
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def _mine(self, processed):
        w, r = max(size(), 1), max(rank(), 0)
        rest = self._order()[min(processed, len(self.dataset)):]
        if rest and len(rest) % w:
            rest += (rest * w)[:w - len(rest) % w]  # padded as DistributedSampler pads
        return rest[r::w]

    def _reset(self):
        """A new iteration shares out what the epoch has not processed now: after a
        rollback (run() calling the function again, a resume) as at __iter__."""
        self._base = self.processed

    def __iter__(self):
        self._reset()
        return iter(self._mine(self._base))

    def __len__(self):
        """This worker's samples in the current iteration (Horovod's num_samples): what the
        epoch had left when the iteration began, shared out; record_batch does not change it
        (a DataLoader's len() stays its batches of the iteration)."""
        return len(self._mine(self._base))

    def get_indices(self, batch_idx, batch_size):
        """This worker's indices of batch `batch_idx` of the current iteration."""
        return self._mine(self._base)[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def record_batch(self, batch_idx, batch_size):
        """Every worker has processed its batch `batch_idx` (from 0, counted from the start
        of the current iteration over the sampler) of batch_size samples: the epoch's
        processed count moves to the start of the iteration plus (batch_idx + 1) *
        batch_size * size(), at most the data set's length."""
        done = self._base + (int(batch_idx) + 1) * int(batch_size) * max(size(), 1)
        self._set(1, min(done, len(self.dataset)))

    def state_dict(self):
        return {"epoch": self.epoch, "processed": self.processed}

    def load_state_dict(self, d):
        self._set(0, int(d["epoch"]))
        self._set(1, int(d["processed"]))
        self._reset()


def _fits(kind, value):
    """A value a scalar of that kind may take: a bool for a bool, an integer for an int, a
    real number for a float (never a bool for a number, nor a number for a bool)."""
    if isinstance(value, bool) or kind is bool:
        return isinstance(value, bool) and kind is bool
    return isinstance(value, numbers.Integral if kind is int else numbers.Real)


class TorchState:
    """hvd.elastic.TorchState(model=None, optimizer=None, **kwargs): the state that rolls
    back after a loss. model and any other torch.nn.Module argument are registered with
    register_module under the argument's name, optimizer and any other
    torch.optim.Optimizer with register_optimizer; int, float and bool arguments become
    0-dimensional tensors "elastic/<name>" (int64, float64, uint8), read and written as
    attributes: `state.epoch += 1`, `for state.batch in range(...)`; an ElasticSampler
    argument's epoch and progress are registered as "elastic/<name>/epoch" and
    "elastic/<name>/processed" (ElasticSampler). Other kinds of values
    (lists, dicts, tensors, schedulers) are a TypeError: they could not roll back with the
    rest. Made after rekindle.elastic.init(), before the first call of the run()
    function; resume() happens at that call."""

    _KINDS = {bool: "uint8", int: "int64", float: "float64"}

    def __init__(self, model=None, optimizer=None, **kwargs):
        ctx = context()
        torch = _tensor.torch
        if torch is None:
            raise Error(_lib.CODES["RK_E_NOTAVAIL"], "TorchState needs torch", "TorchState")
        values = dict(kwargs, model=model, optimizer=optimizer)
        modules, optimizers, scalars, samplers, absent = {}, {}, {}, {}, []
        for name, v in values.items():
            if name.startswith("_") or hasattr(TorchState, name) or "/" in name:
                raise TypeError("TorchState: %r cannot name state (a method, private or with '/')" % name)
            if v is None and name in ("model", "optimizer"):
                absent.append(name)
            elif isinstance(v, torch.nn.Module):
                modules[name] = v
            elif isinstance(v, torch.optim.Optimizer):
                optimizers[name] = v
            elif type(v) in self._KINDS:
                scalars[name] = v
            elif isinstance(v, ElasticSampler):
                samplers[name] = v
            else:
                raise TypeError("TorchState: %s=%r: a %s cannot be rolled back with the registered state (a "
                                "module, an optimizer, an ElasticSampler, an int, a float or a bool can)" % (
                                    name, v, type(v).__name__))
        d = self.__dict__
        d["_ctx"], d["_callbacks"], d["_started"] = ctx, [], False
        d["_objects"] = dict(modules, **optimizers, **samplers, **{name: None for name in absent})
        d["_scalars"] = {}
        first = len(ctx._reg)
        for name, m in modules.items():
            ctx.register_module(name, m)
        for name, o in optimizers.items():
            ctx.register_optimizer(name, o)
        for name, v in scalars.items():
            t = torch.tensor(v, dtype=getattr(torch, self._KINDS[type(v)]))
            ctx.register("elastic/" + name, t)
            d["_scalars"][name] = (t, type(v))
        for name, smp in samplers.items():
            smp._register(ctx, name)
        # This state's registry entries (their .obj follows a rebind): what sync() sends.
        d["_entries"] = ctx._reg[first:]

    # ---- attributes: the registered objects and the scalars --------------------------
    def __getattr__(self, name):
        d = self.__dict__
        if name in d.get("_scalars", ()):
            t, kind = d["_scalars"][name]
            return kind(t.item())
        if name in d.get("_objects", ()):
            return d["_objects"][name]
        raise AttributeError("TorchState has no attribute %r" % name)

    def __setattr__(self, name, value):
        if name in self._scalars:
            t, kind = self._scalars[name]
            if not _fits(kind, value):
                raise TypeError("TorchState: %s was registered as a %s, not a %s" % (
                    name, kind.__name__, type(value).__name__))
            # The snapshot of the last commit may still be copying this tensor.
            self._ctx.before_update()
            t.fill_(value)
        elif name in self._objects:
            if value is not self._objects[name]:
                raise AttributeError("TorchState: %s is registered in place: load into it (load_state_dict), "
                                     "do not replace it" % name)
        else:
            object.__setattr__(self, name, value)  # a plain attribute, as in Horovod: not rolled back

    # ---- Horovod's State -------------------------------------------------------------
    def register_reset_callbacks(self, callbacks):
        """Functions called (in order, no arguments) after each recovery (a loss or a
        growth in place), before the run() function is called again: to rescale a learning
        rate by size(), make samplers for the new world. Also once on a spare brought in,
        before its first call."""
        self._callbacks.extend(callbacks)

    def _on_reset(self):
        self._reset_samplers()
        for callback in self._callbacks:
            callback()

    def _reset_samplers(self):
        for obj in self._objects.values():
            if isinstance(obj, ElasticSampler):
                obj._reset()

    def _start(self):
        if self._started:
            return
        spare = self._ctx.rank < 0
        if not spare:  # a spare receives the members' state in resume()
            self.sync()
        self._ctx.resume()
        self._reset_samplers()  # the progress resumed, if any
        self.__dict__["_started"] = True
        if spare:  # brought in by a loss or a growth: its rank and world are known only now
            self._on_reset()

    def _require_started(self, what):
        if not self._started:
            raise Error(_lib.CODES["RK_E_STATE"], "%s belongs inside the function decorated by "
                        "rekindle.elastic.run (its first call syncs and resumes the state)" % what,
                        "TorchState." + what.split("(")[0])

    def commit(self):
        """Rekindle's step_done: a snapshot of every registered tensor is held in memory
        (copied while the next step computes), which a loss or a growth rolls back to; every
        RK_CKPT_EVERY commits it is also written to disk. As Horovod's commit() (save, then
        check_host_updates()), in one call: rk_step_done looks for a membership change
        before it takes the snapshot. Collective like any step_done; it raises
        HostsUpdatedInterrupt when the job grew in place, rekindle.Recovered when a worker
        was lost (run() handles both); the step just finished is then run again."""
        self._require_started("commit()")
        _collective(self._ctx.step_done, self._ctx.next_step)

    def check_host_updates(self):
        """Horovod's: raises HostsUpdatedInterrupt if the job grew in place since the last
        collective call (a growth asked for by RK_RUN_DIR/grow takes place at the next ring
        call of every member). Collective, as Horovod's (a broadcast there): one allreduce of
        a byte over the ring, so every worker raises it at the same call; rekindle.Recovered
        if a worker was lost instead. commit() needs no call of it (it checks itself); call
        it to look for a growth between commits."""
        self._require_started("check_host_updates()")
        torch = _tensor.torch
        _collective(self._ctx.allreduce, torch.zeros(1, dtype=torch.uint8), "max")

    def restore(self):
        """Not available: the snapshot of the last commit lives in the library, which
        restores it only when a worker is lost or the job grows (then run() sees
        rekindle.Recovered or HostsUpdatedInterrupt with the state already restored).
        Raises rekindle.Error (RK_E_NOTAVAIL)."""
        raise Error(_lib.CODES["RK_E_NOTAVAIL"], "restore() of uncommitted changes from user code is not "
                    "available: the last commit is restored by the library when a worker is lost",
                    "TorchState.restore")

    def sync(self):
        """Every worker gets rank 0's state: the model, the optimizer and the scalars of this
        TorchState, as bytes in one host buffer (device tensors copied through it) given to
        rk_broadcast (rank 0's bytes, zeros elsewhere, a byte-wise MAX over the ring: exact
        for every dtype). Collective; it may raise rekindle.Recovered or
        HostsUpdatedInterrupt."""
        torch, ctx = _tensor.torch, self._ctx
        tensors = [e.obj for e in self._entries if e.nbytes]
        root = ctx.rank == 0
        ctx.before_update()  # the tensors are written below
        flat = torch.zeros(sum(t.numel() * t.element_size() for t in tensors), dtype=torch.uint8)
        views, at = [], 0
        for t in tensors:
            n = t.numel() * t.element_size()
            views.append((t.reshape(-1).view(torch.uint8), flat[at:at + n]))
            at += n
        if root:
            for src, part in views:
                part.copy_(src)
        ctx._raise_pending()
        _collective(lambda: ctx._outcome("rk_broadcast", _lib.lib.rk_broadcast(
            ctx._handle(), flat.data_ptr() or None, flat.numel(), 0)))
        if not root:
            for dst, part in views:
                dst.copy_(part)
