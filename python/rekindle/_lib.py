"""The C library under the package: finding librekindle.so, its prototypes, its codes.

Nothing here knows about torch or numpy. Every call into the library goes through
`call()`, which turns a negative return into `rekindle.Error` with the library's message.
"""
import ctypes
import os

RK_OK = 0
RK_RECOVERED = 1

F32, F64, F16, BF16, I32, I64, U8 = range(7)
DTYPE_NAMES = ("f32", "f64", "f16", "bf16", "i32", "i64", "u8")
DTYPE_SIZES = (4, 8, 2, 2, 4, 8, 1)
OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3}


class Error(Exception):
    """A Rekindle call failed. `code` is the library's code (negative: an RK_E_... value
    or -errno), `name` its symbolic name ("RK_E_TIMEOUT", or "" for -errno), `message`
    what failed and where (rk_last_error)."""

    def __init__(self, code, message, what=""):
        self.code = code
        self.name = _lib_name(code)
        self.message = message
        self.what = what
        text = "%s: %s" % (what, message) if what else message
        super().__init__("%s (%s)" % (text, self.name or "errno %d" % -code) if code else text)

    def __reduce__(self):  # pickled whole (from a worker process: DCP, multiprocessing)
        return (type(self), (self.code, self.message, self.what))


class Recovered(Exception):
    """A member of the job was lost and the survivors recovered: the ring was rebuilt and
    every registered tensor rolled back to the state at the start of step `next_step`.
    Continue the training loop from there."""

    def __init__(self, next_step):
        self.next_step = next_step
        super().__init__("recovered: continue from step %d" % next_step)


class _Options(ctypes.Structure):
    # include/rekindle.h, struct rk_options, field for field (of REKINDLE_ABI_VERSION 1, the
    # soname loaded below).
    _fields_ = [
        ("ckpt_dir", ctypes.c_char_p),
        ("ckpt_every", ctypes.c_int),
        ("keep", ctypes.c_int),
        ("heartbeat_ms", ctypes.c_int),
        ("min_world", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
        ("event_log", ctypes.c_char_p),
        ("det_iface", ctypes.c_char_p),
        ("io", ctypes.c_char_p),
        ("rollback", ctypes.c_char_p),
        ("env_error", ctypes.c_char * 192),
        ("cuda_stream", ctypes.c_void_p),  # rk_options_init writes it: the struct must be whole
        ("snapshot_every", ctypes.c_int),
        ("restore", ctypes.c_char_p),  # taken from the reserved room (same ABI)
        ("reserved_", ctypes.c_void_p * 7),
    ]


STRING_OPTIONS = ("ckpt_dir", "event_log", "det_iface", "io", "rollback", "restore")
INT_OPTIONS = ("ckpt_every", "keep", "heartbeat_ms", "min_world", "timeout_ms", "snapshot_every")


class _TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * 8),
        ("nbytes", ctypes.c_uint64),
    ]


class ReadReq(ctypes.Structure):
    # include/rekindle.h, struct rk_read_req: one tensor of rk_reader_read_many's batch.
    _fields_ = [("i", ctypes.c_size_t), ("buf", ctypes.c_void_p), ("nbytes", ctypes.c_uint64)]


READ_SHARED = 1  # RK_READ_SHARED


def _candidates():
    env = os.environ.get("REKINDLE_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        os.path.join(here, "_native", "librekindle.so.1"),  # an installed wheel's (setup.py)
        os.path.join(here, "..", "..", "build", "lib", "librekindle.so.1"),  # the build tree
        os.path.join(here, "..", "..", "..", "librekindle.so.1"),  # PREFIX/lib/python3/dist-packages
        "librekindle.so.1",  # the dynamic loader's search path
    ]


def _torch_first():
    """Imports torch, when it is installed, before the library: a process holds one
    libnccl.so.2, the first one loaded. torch's CUDA build brings its own NCCL, often newer
    than the one librekindle was built against; loaded second, torch would be bound to
    ours and fail ("libtorch_cuda.so: undefined symbol: ncclCommResume", seen with
    PyTorch 2.15 and NCCL 2.28). The other way round, librekindle runs on torch's (NCCL
    keeps its ABI within a major version). librekindle no longer links NCCL (it finds the
    process's libnccl.so.2 at its first device allreduce: docs/GPU.md, "NCCL at run
    time"), so either order now works."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass


def _load():
    _torch_first()
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s (absent)" % os.path.normpath(path))
            continue
        try:
            # RTLD_GLOBAL: Open MPI loads its components with dlopen, and they resolve
            # libmpi's symbols from the global scope.
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("rekindle: cannot load librekindle.so: tried " + "; ".join(tried) +
                      ". Build it with `make`, install it with `make install PREFIX=...`, "
                      "or set REKINDLE_LIB to its path.")


lib = _load()

_P = ctypes.c_void_p
_PROTOS = {
    "rk_options_init": (None, [ctypes.POINTER(_Options)]),
    "rk_init": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.POINTER(_Options)]),
    "rk_register": (ctypes.c_int, [_P, ctypes.c_char_p, _P, ctypes.c_int, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_int64), ctypes.c_uint]),
    "rk_shard_rows": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64),
                                     ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]),
    "rk_rebind": (ctypes.c_int, [_P, ctypes.c_char_p, _P]),
    "rk_resume": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int64)]),
    "rk_allreduce": (ctypes.c_int, [_P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]),
    "rk_broadcast": (ctypes.c_int, [_P, _P, ctypes.c_size_t, ctypes.c_int]),
    "rk_step_done": (ctypes.c_int, [_P, ctypes.c_int64]),
    "rk_before_update": (ctypes.c_int, [_P]),
    "rk_next_step": (ctypes.c_int64, [_P]),
    "rk_checkpoint": (ctypes.c_int, [_P]),
    "rk_wait": (ctypes.c_int, [_P]),
    "rk_rank": (ctypes.c_int, [_P]),
    "rk_world": (ctypes.c_int, [_P]),
    "rk_finalize": (ctypes.c_int, [ctypes.POINTER(_P)]),
    "rk_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "rk_error_name": (ctypes.c_char_p, [ctypes.c_int]),
    "rk_last_error": (ctypes.c_char_p, []),
    "rk_version": (ctypes.c_char_p, []),
    "rk_reader_open": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.c_char_p, ctypes.c_int64]),
    "rk_reader_step": (ctypes.c_int64, [_P]),
    "rk_reader_world": (ctypes.c_int, [_P]),
    "rk_reader_count": (ctypes.c_size_t, [_P]),
    "rk_reader_info": (ctypes.c_int, [_P, ctypes.c_size_t, ctypes.POINTER(_TensorInfo)]),
    "rk_reader_read": (ctypes.c_int, [_P, ctypes.c_size_t, _P, ctypes.c_uint64]),
    "rk_reader_read_many": (ctypes.c_int, [_P, ctypes.POINTER(ReadReq), ctypes.c_size_t, ctypes.c_uint]),
    "rk_reader_close": (None, [ctypes.POINTER(_P)]),
}
for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


def _lib_name(code):
    s = lib.rk_error_name(code)
    return s.decode() if s else ""


# The codes, as module constants (rekindle.RK_E_TIMEOUT, ...), from the library's own table.
CODES = {}
for _code in range(-1001, -1200, -1):
    _n = _lib_name(_code)
    if _n:
        CODES[_n] = _code


def last_error():
    return (lib.rk_last_error() or b"").decode(errors="replace")


def strerror(code):
    return (lib.rk_strerror(code) or b"").decode(errors="replace")


def call(what, rc):
    """rc of a library call: returned if >= 0, else raised as Error."""
    if rc < 0:
        raise Error(rc, last_error() or strerror(rc), what)
    return rc


# XXH64 from the libxxhash that librekindle links (the contract's hash of the state).
try:
    _xxh = ctypes.CDLL("libxxhash.so.0")
    _xxh.XXH64.restype = ctypes.c_uint64
    _xxh.XXH64.argtypes = [_P, ctypes.c_size_t, ctypes.c_uint64]
    _xxh.XXH64_createState.restype = _P
    _xxh.XXH64_reset.argtypes = [_P, ctypes.c_uint64]
    _xxh.XXH64_update.argtypes = [_P, _P, ctypes.c_size_t]
    _xxh.XXH64_digest.restype = ctypes.c_uint64
    _xxh.XXH64_digest.argtypes = [_P]
    _xxh.XXH64_freeState.argtypes = [_P]
except OSError:  # pragma: no cover - librekindle itself needs it
    _xxh = None


def xxh64(chunks):
    """XXH64 (seed 0) of the concatenation of (address, length) pieces."""
    if _xxh is None:
        raise Error(CODES["RK_E_NOTAVAIL"], "libxxhash.so.0 is not available", "state_hash")
    st = _xxh.XXH64_createState()
    try:
        _xxh.XXH64_reset(st, 0)
        for ptr, n in chunks:
            if n:
                _xxh.XXH64_update(st, ptr, n)
        return _xxh.XXH64_digest(st)
    finally:
        _xxh.XXH64_freeState(st)
