"""What the library needs to know of a torch tensor or a numpy array: its address, dtype,
shape and size, after checking that it can be registered (CPU or CUDA memory,
C-contiguous, writable, a dtype the checkpoint format holds). torch is imported only when
present.
"""
from . import _lib

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with torch and h5py
    np = None

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    TORCH_DTYPES = {
        torch.float32: _lib.F32, torch.float64: _lib.F64, torch.float16: _lib.F16,
        torch.bfloat16: _lib.BF16, torch.int32: _lib.I32, torch.int64: _lib.I64,
        torch.uint8: _lib.U8,
    }
    TORCH_OF = {v: k for k, v in TORCH_DTYPES.items()}
else:
    TORCH_DTYPES, TORCH_OF = {}, {}

if np is not None:
    NUMPY_DTYPES = {
        np.dtype(np.float32): _lib.F32, np.dtype(np.float64): _lib.F64,
        np.dtype(np.float16): _lib.F16, np.dtype(np.int32): _lib.I32,
        np.dtype(np.int64): _lib.I64, np.dtype(np.uint8): _lib.U8,
    }
    # numpy has no bfloat16: a bf16 tensor read without torch comes back as its raw bits.
    NUMPY_OF = {v: k for k, v in NUMPY_DTYPES.items()}
    NUMPY_OF[_lib.BF16] = np.dtype(np.uint16)
else:
    NUMPY_DTYPES, NUMPY_OF = {}, {}


def is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda(x):
    return is_torch(x) and x.device.type == "cuda"


def describe(name, x):
    """(address, dtype code, shape tuple, nbytes) of x, or Error(-EINVAL) naming what is
    wrong with it. A CUDA tensor must be on the current device (one GPU per worker: the
    library's copies and NCCL run there)."""
    bad = lambda why: _lib.Error(-22, "tensor '%s': %s" % (name, why), "register")
    if is_torch(x):
        if x.device.type not in ("cpu", "cuda"):
            raise bad("on device %s: Rekindle takes CPU and CUDA tensors (move it with .cpu())" % x.device)
        if x.device.type == "cuda" and x.device.index != torch.cuda.current_device():
            raise bad("on %s, but this worker's current device is cuda:%d: one GPU per worker, "
                      "chosen with torch.cuda.set_device() before its tensors are made"
                      % (x.device, torch.cuda.current_device()))
        if x.dtype not in TORCH_DTYPES:
            raise bad("dtype %s is not one of %s" % (x.dtype, ", ".join(str(d) for d in TORCH_DTYPES)))
        if not x.is_contiguous():
            raise bad("not contiguous (strides %s): register x.contiguous() and train on that tensor"
                      % (tuple(x.stride()),))
        if x.is_sparse or x.is_quantized:
            raise bad("sparse and quantized tensors cannot be registered")
        return x.data_ptr(), TORCH_DTYPES[x.dtype], tuple(x.shape), x.numel() * x.element_size()
    if np is not None and isinstance(x, np.ndarray):
        if x.dtype not in NUMPY_DTYPES:
            raise bad("dtype %s is not one of %s" % (x.dtype, ", ".join(str(d) for d in NUMPY_DTYPES)))
        if not x.flags["C_CONTIGUOUS"]:
            raise bad("not C-contiguous: register np.ascontiguousarray(x) and train on that array")
        if not x.flags["WRITEABLE"]:
            raise bad("read-only: a restore writes into registered memory")
        return x.ctypes.data, NUMPY_DTYPES[x.dtype], tuple(x.shape), x.nbytes
    raise bad("a %s is neither a torch.Tensor nor a numpy.ndarray" % type(x).__name__)


def count(x):
    return x.numel() if is_torch(x) else x.size


def address(x):
    return x.data_ptr() if is_torch(x) else x.ctypes.data


def host_bytes(x):
    """x's bytes in host memory, as a C-contiguous object with .data_ptr() or .ctypes: x
    itself for host memory, a copy for a CUDA tensor (waits for the work queued on it)."""
    return x.detach().cpu() if is_cuda(x) else x


def empty(dtype, shape, as_torch):
    """A new C-contiguous host buffer of the library's dtype code and shape."""
    if as_torch:
        return torch.empty(shape, dtype=TORCH_OF[dtype])
    return np.empty(shape, dtype=NUMPY_OF[dtype])
