"""rekindle.backend - the torch.distributed backend "rekindle": a ProcessGroup whose
collectives run over Rekindle's ring, so that an unchanged DistributedDataParallel (no
comm hook) survives a lost worker. docs/PYTHON.md, "The torch.distributed backend".

    rk = rekindle.init(ckpt_dir="ckpt")          # the job; its Context is the group's
    dist.init_process_group("rekindle")          # under `rekindle run`: nothing else to set
    rk.register_module("model", model); rk.register_optimizer("optim", optimizer)
    step = rk.resume()
    ddp = DistributedDataParallel(model)         # unchanged
    ... except rekindle.Recovered as r: step = r.next_step

`import rekindle` registers the backend (dist.Backend.register_backend) where
torch.distributed is available; nothing else happens until init_process_group.

Invariants (tests/py/backend_check.py and the job_check.py mode `backend` cite them):

  P1. One group per Context. The group's rank and size are the Context's now (renumbered
      after a loss): rank()/size() and the getRank()/getSize() that DDP's reducer asks at
      every backward pass (torch >= 2: its division of the gradients follows the world).
  P2. Every collective is synchronous: it has run (or failed) when the call returns; the
      Work it returns is already complete. Nothing writes a tensor after that.
  P3. A floating-point sum (SUM, AVG; allreduce and reduce_scatter) is every rank's tensor
      gathered (a byte-wise MAX over zero padding, exact) and added in rank order: the
      result does not depend on where an element sits in the buffer, so DDP's
      re-bucketing (its first pass after a start or a resume uses other buckets than the
      later ones) cannot make a job that lost a worker differ from a replay. It moves W
      times the bytes of a ring allreduce. Integer sums, MAX and MIN are exact in any
      order and use the ring itself.
  P4. A lost member found by a collective outside a backward pass raises
      rekindle.Recovered from the call, the registered state already rolled back (as
      Context.allreduce). Inside a backward pass (DDP's reducer) it cannot be raised
      (DDP would be left half-reduced and refuse the next pass): the Work completes with
      the tensors as they are, the rest of the pass skips its collectives, and the
      registered optimizer's next step() raises Recovered before it changes anything
      (the DDP hook's rule, allreduce_hook). So inside a backward pass the group refuses
      to run without an optimizer registered with register_optimizer.
  P5. A call the group does not offer raises rekindle.Error (RK_E_NOTAVAIL) naming it;
      it never hangs and never returns an incomplete Work.

States of a collective (the function for each transition):

    called --(pending recovery, in backward: P4)--> skipped ------------> complete Work
      | _run                                                                 ^
      +--(pending recovery, not in backward)--> Recovered raised             |
      +--> runs over the ring (_sum, _gather, rk_broadcast, rk_allreduce) ---+
              +--(RK_RECOVERED in backward)--> pending (Context._pending) ---+
              +--(RK_RECOVERED elsewhere)--> Recovered raised
              +--(error)--> rekindle.Error raised
"""
import os
import socket

from . import _lib, _tensor
from ._lib import Error, Recovered

torch = _tensor.torch
dist = None
if torch is not None:
    try:
        import torch.distributed as dist
        if not dist.is_available():
            dist = None
    except ImportError:
        dist = None

NAME = "rekindle"
_NOTAVAIL = _lib.CODES["RK_E_NOTAVAIL"]


def _make_work(result):
    """A complete Work (P2) whose future holds `result`, as c10d's C++ callers (DDP's
    reducer) and Python's work.wait() both expect."""
    f = torch.futures.Future()
    f.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(f)


def _in_backward():
    """Whether this thread runs an autograd backward pass (torch >= 2 can tell; 1.13 cannot,
    so there every loss is raised from the call: docs/PYTHON.md)."""
    node = getattr(torch._C, "_current_autograd_node", None)
    return node is not None and node() is not None


def _op_name(opts):
    op = getattr(opts, "reduceOp", opts)
    for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if op == getattr(dist.ReduceOp, name, None):
            return name
    return str(op)


if dist is not None:
    class ProcessGroup(dist.ProcessGroup):
        """The group of a Rekindle job (made by init_process_group("rekindle") from the
        live Context). Offers allreduce (SUM, AVG, MAX, MIN), broadcast, allgather,
        all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor and barrier, on CPU
        tensors and CUDA tensors of the worker's device; anything else raises
        rekindle.Error (RK_E_NOTAVAIL)."""

        def __init__(self, ctx):
            super().__init__(ctx.rank, ctx.world)
            self.context = ctx

        # ---- P1 ---------------------------------------------------------------------
        def rank(self):
            return self.context.rank

        def size(self):
            return self.context.world

        def getRank(self):
            return self.context.rank

        def getSize(self):
            return self.context.world

        def getBackendName(self):
            return NAME

        def name(self):
            return NAME

        # ---- P2, P4 -----------------------------------------------------------------
        def _run(self, what, tensors, fn):
            ctx = self.context
            backward = _in_backward()
            if backward and not ctx._guarded:
                from . import _HookError
                raise _HookError(_lib.CODES["RK_E_STATE"],
                                 "%s inside a backward pass (DistributedDataParallel) with no optimizer "
                                 "registered (rk.register_optimizer): after a recovery there, optimizer.step() "
                                 "would apply this rank's unreduced gradients to the rolled-back weights" % what,
                                 NAME)
            if ctx._pending is None:
                try:
                    fn()
                except Recovered as r:
                    if not backward:
                        raise
                    ctx._pending = r.next_step
            elif not backward:
                ctx._raise_pending()
            return _make_work(tensors)

        def _check(self, what, tensors):
            for t in tensors:
                _tensor.describe("%s tensor" % what, t)  # dtype, device, contiguity

        def _sum(self, t, avg):
            """P3: t becomes the sum (avg: the mean) of every rank's t, in rank order."""
            parts = self._gather(t)
            acc = parts[0].to(torch.float32) if t.element_size() < 4 else parts[0].clone()
            for p in parts[1:]:
                acc += p
            if avg:  # a tensor divisor: torch divides by a scalar as a product with its inverse on CUDA
                acc /= torch.full((), parts.shape[0], dtype=acc.dtype, device=acc.device)
            t.copy_(acc.view_as(t))

        def _gather(self, t):
            """Every rank's t, as a (world, numel) tensor in rank order: zeros but for this
            rank's row, then a byte-wise MAX over the ring (exact for any dtype)."""
            ctx = self.context
            n = t.numel()
            buf = torch.zeros(ctx.world, n, dtype=t.dtype, device=t.device)
            buf[ctx.rank].copy_(t.reshape(-1))
            ctx.allreduce(buf.view(-1).view(torch.uint8), "max")
            return buf

        def _reduce(self, t, op):
            if op in ("SUM", "AVG") and t.is_floating_point():
                self._sum(t, op == "AVG")
            elif op in ("SUM", "MAX", "MIN"):
                self.context.allreduce(t, op.lower())
            else:
                raise Error(_lib.CODES["RK_E_OP"], "op %s on a %s tensor: the group reduces with SUM, AVG "
                            "(floating point), MAX and MIN" % (op, t.dtype), NAME)

        def allreduce(self, tensors, opts=None):
            op = "SUM" if opts is None else _op_name(opts)
            self._check("allreduce", tensors)

            def run():
                for t in tensors:
                    self._reduce(t, op)
            return self._run("allreduce", tensors, run)

        def broadcast(self, tensors, opts=None):
            root = 0 if opts is None else opts.rootRank
            self._check("broadcast", tensors)

            def run():
                for t in tensors:
                    host = _tensor.host_bytes(t)
                    self.context._outcome("rk_broadcast", _lib.lib.rk_broadcast(
                        self.context._handle(), host.data_ptr() or None, host.numel() * host.element_size(), root))
                    if host is not t:
                        t.copy_(host)
            return self._run("broadcast", tensors, run)

        def allgather(self, output_lists, inputs, opts=None):
            self._check("allgather", inputs)
            self._want("allgather", len(output_lists) == 1 and len(inputs) == 1 and
                       len(output_lists[0]) == self.size() and
                       all(o.numel() == inputs[0].numel() for o in output_lists[0]),
                       "one input and a list of world-size outputs of its size")

            def run():
                parts = self._gather(inputs[0])
                for o, p in zip(output_lists[0], parts):
                    o.copy_(p.view_as(o))
            return self._run("allgather", output_lists, run)

        def _allgather_base(self, output, input, opts=None):
            self._check("all_gather_into_tensor", [input])
            self._want("all_gather_into_tensor", output.numel() == input.numel() * self.size(),
                       "an output of world-size times the input's elements")

            def run():
                output.copy_(self._gather(input).view_as(output))
            return self._run("all_gather_into_tensor", [output], run)

        def reduce_scatter(self, outputs, input_lists, opts=None):
            op = "SUM" if opts is None else _op_name(opts)
            self._want("reduce_scatter", len(outputs) == 1 and len(input_lists) == 1 and
                       len(input_lists[0]) == self.size() and
                       all(i.numel() == outputs[0].numel() for i in input_lists[0]),
                       "one output and a list of world-size inputs of its size")
            self._check("reduce_scatter", input_lists[0])

            def run():
                whole = torch.cat([i.reshape(-1) for i in input_lists[0]])
                self._reduce(whole, op)
                outputs[0].copy_(whole.view(self.size(), -1)[self.rank()].view_as(outputs[0]))
            return self._run("reduce_scatter", outputs, run)

        def _reduce_scatter_base(self, output, input, opts=None):
            op = "SUM" if opts is None else _op_name(opts)
            self._check("reduce_scatter_tensor", [input])
            self._want("reduce_scatter_tensor", input.numel() == output.numel() * self.size(),
                       "an input of world-size times the output's elements")

            def run():
                whole = input.reshape(-1).clone()
                self._reduce(whole, op)
                output.copy_(whole.view(self.size(), -1)[self.rank()].view_as(output))
            return self._run("reduce_scatter_tensor", [output], run)

        all_gather_single = _allgather_base            # their names in newer torch (2.15)
        reduce_scatter_single = _reduce_scatter_base

        def barrier(self, opts=None):
            def run():
                self.context.allreduce(torch.zeros(1, dtype=torch.int32), "max")
            return self._run("barrier", [], run)

        def _want(self, what, ok, shape):
            if not ok:
                raise Error(-22, "%s: want %s (world %d)" % (what, shape, self.size()), NAME)

        # ---- P5 ---------------------------------------------------------------------
        def _refuse(self, what):
            raise Error(_NOTAVAIL, "%s is not offered by the rekindle backend (it offers allreduce, "
                        "broadcast, allgather, all_gather_into_tensor, reduce_scatter, "
                        "reduce_scatter_tensor and barrier: docs/PYTHON.md)" % what, NAME)

        def allreduce_coalesced(self, *a, **k):
            self._refuse("allreduce_coalesced")

        def allgather_coalesced(self, *a, **k):
            self._refuse("allgather_coalesced")

        def reduce(self, *a, **k):
            self._refuse("reduce")

        def gather(self, *a, **k):
            self._refuse("gather")

        def scatter(self, *a, **k):
            self._refuse("scatter")

        def alltoall(self, *a, **k):
            self._refuse("all_to_all")

        def alltoall_base(self, *a, **k):
            self._refuse("all_to_all_single")

        def send(self, *a, **k):
            self._refuse("send")

        def recv(self, *a, **k):
            self._refuse("recv")

        def recv_anysource(self, *a, **k):
            self._refuse("recv (any source)")

        def monitored_barrier(self, *a, **k):
            self._refuse("monitored_barrier")


def _context():
    from . import _live
    live = [c for c in list(_live) if c._h is not None]
    if len(live) != 1:
        raise Error(_lib.CODES["RK_E_STATE"], "init_process_group('rekindle') needs exactly one live "
                    "rekindle.init() Context in this process (there are %d): call rekindle.init() first"
                    % len(live), NAME)
    return live[0]


def _create(store, rank, size, timeout):
    """The backend's creator (dist.Backend.register_backend): the group of the live
    Context; torch's rank and size must be the job's."""
    ctx = _context()
    if (rank, size) != (ctx.rank, ctx.world):
        raise Error(-22, "a group of rank %d of %d asked (init_process_group's rank= and world_size=, or "
                    "new_group): the rekindle backend's one group is the job's, rank %d of %d" % (
                        rank, size, ctx.rank, ctx.world), NAME)
    return ProcessGroup(ctx)


def _address():
    """This host's address the other workers can reach: RK_DET_IFACE when it is an
    address (the detector's), else the outward address (the route to a public
    address; no packet is sent), else the loopback."""
    iface = os.environ.get("RK_DET_IFACE", "")
    try:
        socket.inet_aton(iface)
        return iface
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _fill_env(ctx):
    """torchrun's variables for this job, where unset: RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE from the job and its launch, MASTER_ADDR and MASTER_PORT rank 0's
    address and a free port there (one rk_broadcast), so that env:// makes a TCPStore
    every worker reaches (init_process_group's barrier in torch 1.13 needs a shared one)."""
    buf = _tensor.np.zeros(256, dtype=_tensor.np.uint8)
    if ctx.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        text = ("%s %d" % (_address(), port)).encode()
        buf[:len(text)] = list(text)
    ctx._outcome("rk_broadcast", _lib.lib.rk_broadcast(ctx._handle(), buf.ctypes.data, buf.nbytes, 0))
    addr, port = bytes(buf).rstrip(b"\0").decode().split()
    env = {"MASTER_ADDR": addr, "MASTER_PORT": port, "RANK": str(ctx.rank), "WORLD_SIZE": str(ctx.world),
           "LOCAL_RANK": os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
           "LOCAL_WORLD_SIZE": os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")}
    for k, v in env.items():
        os.environ.setdefault(k, v)


def _wrap_env_rendezvous():
    """env:// (init_process_group's default) in a Rekindle job with no MASTER_ADDR set
    (`rekindle run` sets none): the job's variables are filled in first (_fill_env), for
    any backend. Elsewhere torch's handler runs as it is."""
    import importlib
    rdzv = importlib.import_module("torch.distributed.rendezvous")  # the module, not its function
    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    env = handlers.get("env") if handlers else None
    if env is None or getattr(env, "_rekindle", False):
        return

    def handler(url, **kwargs):
        from . import _live
        if "MASTER_ADDR" not in os.environ and any(c._h is not None for c in list(_live)):
            _fill_env(_context())
        return env(url, **kwargs)
    handler._rekindle = True
    handlers["env"] = handler


def register():
    """Registers the backend "rekindle" with torch.distributed (idempotent)."""
    if dist is None or not hasattr(torch._C._distributed_c10d, "_create_work_from_future"):
        return False
    if getattr(dist.Backend, NAME.upper(), None) is None:
        try:
            dist.Backend.register_backend(NAME, _create, devices=["cpu", "cuda"])
        except TypeError:  # torch 1.13: no devices
            dist.Backend.register_backend(NAME, _create)
    _wrap_env_rendezvous()
    return True


register()
