"""rekindle.dcp: a storage of torch.distributed.checkpoint (DCP) that writes Rekindle's
checkpoints.

    import torch.distributed.checkpoint as dcp, rekindle.dcp
    dcp.save(state_dict, storage_writer=rekindle.dcp.Writer("ckpt"))
    dcp.async_save(state_dict, storage_writer=rekindle.dcp.Writer("ckpt"))
    dcp.load(state_dict, storage_reader=rekindle.dcp.Reader("ckpt"))
    rekindle.dcp.latest("ckpt")    # the newest committed label, None for none

DCP's own planners decide who writes what (a replicated tensor once, a DDP model's by one
rank; an FSDP2 model's DTensor shards by their owners) and who reads what (resharding N ->
M). What lands on disk is a Rekindle checkpoint `<path>/step-<S>/` (docs/FORMAT.md), made by
the library's own format code (librekindle, formats/): each rank's shard-<r>.h5 through the
io_uring HDF5 driver (RK_IO), each tensor's XXH3-64 while it is written, its manifest;
then, on DCP's coordinator, index.h5, the commit record, the atomic rename of the attempt's
.tmp-step-... directory, and retention (keep). So `rekindle ls/verify/inspect/restore`,
h5py, `rekindle.load` and `rk_resume` read it, and `Reader` reads any Rekindle checkpoint,
one written by a job's rk_checkpoint included.

The layout (docs/PYTHON.md, "torch.distributed.checkpoint"):
  - a whole tensor: a dataset at its fully qualified name ("model.layer.weight");
  - a DTensor/ShardedTensor chunk that is a range of rows (dimension 0: FSDP2's Shard(0)):
    a sharded piece; index.h5 shows the global tensor (a virtual dataset). Other chunks
    (sharded along another dimension, several chunks of one tensor on a rank) are refused
    with an error naming the tensor;
  - anything DCP serializes as bytes (non-tensor values): a uint8 dataset "dcp/bytes/<fqn>".
DCP's Metadata is not stored: Reader rebuilds it from the checkpoint (one chunk per tensor,
the global tensor), so DCP's load planner reshards from it.

The label: Writer(path, step=S), or one past the newest committed label (0 for none).
Needs torch >= 2.2 (DCP's StorageWriter with reset/storage_meta); torch 1.13 has no
torch.distributed.checkpoint.StorageWriter of that form: importing this module fails there
with an ImportError that says so.
"""
import collections
import ctypes
import dataclasses
import io
import os
import secrets
import socket
import threading

from . import _lib, _tensor

try:
    import torch
    from torch.distributed.checkpoint import Metadata
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                       TensorProperties, TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
    from torch.futures import Future
except ImportError as e:  # torch 1.13 (Debian 12), or no torch
    raise ImportError("rekindle.dcp needs torch.distributed.checkpoint's StorageWriter/StorageReader of "
                      "torch >= 2.2 (this torch: %s; %s)" % (getattr(_tensor.torch, "__version__", "none"), e))

BYTES = "dcp/bytes/"
_P = ctypes.c_void_p


# ---- the library's format code (formats/fmt.h, ckpt/ckpt.h), field for field -------------
class _FmtTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 8), ("nbytes", ctypes.c_uint64), ("xxh3", ctypes.c_uint64),
                ("offset", ctypes.c_uint64), ("order", ctypes.c_uint32), ("rank", ctypes.c_int),
                ("data", _P), ("kind", ctypes.c_int), ("rows", ctypes.c_int64), ("row0", ctypes.c_int64),
                ("block_rows", ctypes.c_uint64), ("nblocks", ctypes.c_uint64), ("blocks", _P),
                ("stored", ctypes.c_char_p), ("piece0", ctypes.c_size_t), ("npieces", ctypes.c_size_t)]


class _FmtManifest(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("step", ctypes.c_int64), ("rank", ctypes.c_int),
                ("world", ctypes.c_int), ("nonce", ctypes.c_uint64), ("io_path", ctypes.c_char * 48),
                ("file_size", ctypes.c_uint64), ("file_xxh3", ctypes.c_uint64), ("n", ctypes.c_size_t),
                ("t", ctypes.POINTER(_FmtTensor)), ("ready", _P), ("ready_arg", _P)]


class _FmtWriteStats(ctypes.Structure):
    _fields_ = [("io_path", ctypes.c_char * 48), ("bytes", ctypes.c_uint64), ("prealloc", ctypes.c_uint64),
                ("extends", ctypes.c_uint64), ("io_auto", ctypes.c_char * 16), ("auto_direct_gbs", ctypes.c_double),
                ("auto_buffered_gbs", ctypes.c_double), ("auto_first", ctypes.c_bool), ("auto_measured", ctypes.c_bool)]


FMT_VERSION, FMT_REPLICATED, FMT_SHARDED = 2, 0, 1
_L = _lib.lib
for _name, _res, _args in (
        ("fmt_shard_write", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_FmtManifest), ctypes.c_char_p,
                                           ctypes.POINTER(_FmtWriteStats)]),
        ("fmt_manifest_write", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_FmtManifest)]),
        ("fmt_manifest_read", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_P)]),
        ("fmt_manifest_free", None, [ctypes.POINTER(_P)]),
        ("fmt_index_write", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int, ctypes.POINTER(_P),
                                           ctypes.c_char_p, ctypes.c_int64]),
        ("fmt_commit_dir", ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]),
        ("fmt_tmp_name", None, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_uint64]),
        ("fmt_step_name", None, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int64]),
        ("fmt_io_mkdir", ctypes.c_int, [ctypes.c_char_p]),
        ("fmt_list_steps", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                                          ctypes.POINTER(ctypes.c_size_t)]),
        ("ckpt__commit_ns", ctypes.c_int64, [ctypes.c_char_p]),
        ("ckpt__retain", None, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int64])):
    _f = getattr(_L, _name)
    _f.restype, _f.argtypes = _res, _args
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [_P]


def _name(fn, *args):
    buf = ctypes.create_string_buffer(64)
    fn(buf, 64, *args)
    return buf.value.decode()


def _steps(path):
    """The committed labels under path, ascending ([] when path does not exist)."""
    if not os.path.isdir(path):
        return []
    p, n = ctypes.POINTER(ctypes.c_int64)(), ctypes.c_size_t()
    _lib.call("rekindle.dcp: list %s" % path, _L.fmt_list_steps(os.fsencode(path), ctypes.byref(p), ctypes.byref(n)))
    try:
        return [p[i] for i in range(n.value)]
    finally:
        _libc.free(p)


# The retention that follows a Writer's commit runs on in a thread of its own (the commit is
# the save's end, as rk_wait's answer is in ckpt.c J6), one per checkpoint directory: the
# next attempt under that directory waits for it first, and the interpreter's exit too
# (not a daemon thread). {realpath: Thread}
_retention = {}
_retention_lock = threading.Lock()


def _retention_wait(path):
    with _retention_lock:
        t = _retention.pop(os.path.realpath(path), None)
    if t is not None:
        t.join()


def _retention_start(path, keep, step):
    # The checkpoint just committed counts as verifying if it reopens intact: every byte
    # of its data was checksummed from the memory it was written from (fmt_shard_write)
    # and is durable. ckpt_retain would read all of it again against its checksums first
    # to find the newest checkpoint that verifies (1.8-2.1 s of a 1 GiB save's 2.8-3.3 s
    # on 2 ranks). As the library's own writer (ckpt/writer.c W4): a removal that fails is
    # logged, not raised: the commit stands.
    t = threading.Thread(target=_L.ckpt__retain, args=(os.fsencode(path), keep, step),
                         name="rekindle.dcp retention")
    with _retention_lock:
        _retention[os.path.realpath(path)] = t
    t.start()


def latest(path):
    """The newest committed label under path (the step Reader(path) reads), None when there
    is none (path missing included): where a (re)launched program looks before dcp.load."""
    done = _steps(path)
    return done[-1] if done else None


@dataclasses.dataclass(frozen=True)
class _Attempt:
    """What the coordinator tells every rank (SavePlan.storage_data): one attempt's label,
    nonce and temporary directory, and the rank's place among DCP's plans."""
    step: int
    nonce: int
    tmpname: str
    rank: int
    world: int
    order: dict  # stored name -> its position, the same on every rank (index.h5's order)


def _stored_name(item):
    return (BYTES if item.type == WriteItemType.BYTE_IO else "") + item.index.fqn


def _read_name(item):
    return (BYTES if item.type == LoadItemType.BYTE_IO else "") + item.storage_index.fqn


def _row_piece(item):
    """(row0, global rows) of a write item's chunk if it is a range of rows of the global
    tensor (every other dimension whole), None for a whole tensor; ValueError otherwise."""
    size = tuple(item.tensor_data.size)
    chunk = item.tensor_data.chunk
    offs, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
    if offs == (0,) * len(size) and sizes == size:
        return None
    if len(size) and offs[1:] == (0,) * (len(size) - 1) and sizes[1:] == size[1:]:
        return offs[0], size[0]
    raise ValueError("rekindle.dcp: '%s': a chunk at offsets %s of sizes %s of %s is not a range of rows: "
                     "Rekindle's checkpoints hold whole tensors and pieces along dimension 0 (FSDP2's "
                     "Shard(0))" % (item.index.fqn, offs, sizes, size))


class Writer(StorageWriter):
    """A StorageWriter that commits a Rekindle checkpoint under `path` (the label: `step`,
    or one past the newest). keep: committed checkpoints kept (RK_KEEP's retention; None
    keeps all). io: RK_IO's "auto", "uring" or "buffered"."""

    def __init__(self, path, step=None, keep=3, io="auto"):
        super().__init__()
        self.path = os.fspath(path)
        self.step = step
        self.keep = keep
        self.io = io
        self.is_coordinator = False

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.is_coordinator = is_coordinator

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))

    def prepare_local_plan(self, plan):
        for item in plan.items:
            if item.type != WriteItemType.BYTE_IO:
                _row_piece(item)  # refused here, before anything is written
        return plan

    def prepare_global_plan(self, plans):
        _retention_wait(self.path)  # the last commit's retention here is over
        os.makedirs(self.path, exist_ok=True)
        done = _steps(self.path)
        step = self.step if self.step is not None else (done[-1] + 1 if done else 0)
        nonce = secrets.randbits(64)
        tmpname = _name(_L.fmt_tmp_name, step, nonce)
        _lib.call("rekindle.dcp: mkdir", _L.fmt_io_mkdir(os.fsencode(os.path.join(self.path, tmpname))))
        order = {}
        for p in plans:
            for item in p.items:
                order.setdefault(_stored_name(item), len(order))
        self._attempt = _Attempt(step, nonce, tmpname, 0, len(plans), order)
        return [dataclasses.replace(p, storage_data=dataclasses.replace(self._attempt, rank=r))
                for r, p in enumerate(plans)]

    def write_data(self, plan, planner):
        a = plan.storage_data
        keep, names, tensors, results = [], [], [], []
        for item in plan.items:
            data = planner.resolve_data(item)
            name = _stored_name(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
                piece = None
            else:
                t = data.detach().cpu().contiguous()
                piece = _row_piece(item)
            keep.append(t)
            names.append(name.encode())
            tensors.append((t, piece))
            results.append(WriteResult(index=item.index, size_in_bytes=t.numel() * t.element_size(),
                                       storage_data=name))
        m = _FmtManifest(version=FMT_VERSION, step=a.step, rank=a.rank, world=a.world, nonce=a.nonce,
                         n=len(tensors))
        arr = (_FmtTensor * max(1, len(tensors)))()
        for i, (t, piece) in enumerate(tensors):
            f = arr[i]
            f.name, f.order, f.rank = names[i], a.order[names[i].decode()], a.rank
            _, f.dtype, shape, f.nbytes = _tensor.describe(names[i].decode(), t)
            f.ndim = len(shape)
            for d, s in enumerate(shape):
                f.shape[d] = s
            f.data = t.data_ptr() if t.numel() else None
            if piece is not None:
                f.kind, f.row0, f.rows = FMT_SHARDED, piece[0], piece[1]
        m.t = arr
        tmpdir = os.path.join(self.path, a.tmpname)
        st = _FmtWriteStats()
        try:
            _lib.call("rekindle.dcp: write shard %d" % a.rank, _L.fmt_shard_write(
                os.fsencode(os.path.join(tmpdir, "shard-%d.h5" % a.rank)), ctypes.byref(m), self.io.encode(),
                ctypes.byref(st)))
            m.io_path = st.io_path
            _lib.call("rekindle.dcp: write manifest %d" % a.rank, _L.fmt_manifest_write(
                os.fsencode(os.path.join(tmpdir, "shard-%d.ok" % a.rank)), ctypes.byref(m)))
        finally:
            for i in range(len(tensors)):
                _libc.free(arr[i].blocks)  # a sharded piece's block checksums (fmt_shard_write's)
                arr[i].blocks = None
        del keep
        fut = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results):
        # Every rank's write_data returned (DCP gathered their results): every manifest is
        # in the attempt's directory. index.h5, the commit record, the rename, retention.
        a = self._attempt
        base = os.fsencode(self.path)
        tmpdir = os.path.join(self.path, a.tmpname)
        shards = (_P * a.world)()
        try:
            for r in range(a.world):
                one = _P()
                _lib.call("rekindle.dcp: manifest %d" % r, _L.fmt_manifest_read(
                    os.fsencode(os.path.join(tmpdir, "shard-%d.ok" % r)), ctypes.byref(one)))
                shards[r] = one
            io_paths = {ctypes.cast(shards[r], ctypes.POINTER(_FmtManifest)).contents.io_path for r in range(a.world)}
            io_path = io_paths.pop() if len(io_paths) == 1 else b"mixed"
            _lib.call("rekindle.dcp: index", _L.fmt_index_write(os.fsencode(tmpdir), a.step, a.world, shards, io_path,
                                                                _L.ckpt__commit_ns(base)))
        finally:
            for r in range(a.world):
                if shards[r]:
                    p = _P(shards[r])
                    _L.fmt_manifest_free(ctypes.byref(p))
        _lib.call("rekindle.dcp: commit", _L.fmt_commit_dir(base, a.tmpname.encode(),
                                                             _name(_L.fmt_step_name, a.step).encode()))
        if self.keep is not None:
            _retention_start(self.path, self.keep, a.step)

    def storage_meta(self):
        return None


@dataclasses.dataclass(frozen=True)
class _Readers:
    """What the coordinator tells each rank of a load (LoadPlan.storage_data): the stored
    names it reads that another rank of its machine reads too."""
    shared: frozenset


class Reader(StorageReader):
    """A StorageReader of the Rekindle checkpoint under `path` (the newest committed, or
    label `step`): any of them, whoever wrote it (Writer, a job's rk_checkpoint). Every
    tensor read is checked against its checksum (rk_reader). A rank's reads go to the
    library as one batch (rk_reader_read_many), straight into DCP's destinations where
    they are whole tensors of the checkpoint; the tensors that another rank of the same
    machine reads too (a replicated state dict: all of them) go through the page cache,
    read from the disk once for the machine (RK_READ_SHARED), the others O_DIRECT.
    shared=True/False decides that for every tensor instead."""

    def __init__(self, path, step=None, shared=None):
        super().__init__()
        self.path = os.fspath(path)
        self.step = step
        self.shared = shared

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))

    def _open(self):
        r = _P()
        _lib.call("rekindle.dcp: open %s" % self.path, _L.rk_reader_open(
            ctypes.byref(r), os.fsencode(self.path), -1 if self.step is None else self.step))
        return r

    def _entries(self, r):
        out, info = {}, _lib._TensorInfo()
        for i in range(_L.rk_reader_count(r)):
            _lib.call("rekindle.dcp", _L.rk_reader_info(r, i, ctypes.byref(info)))
            out[info.name.decode()] = (i, info.dtype, tuple(info.shape[:info.ndim]), info.nbytes)
        return out

    def read_metadata(self, *args, **kwargs):
        r = self._open()
        try:
            md = {}
            for name, (_, dtype, shape, _) in self._entries(r).items():
                if name.startswith(BYTES):
                    md[name[len(BYTES):]] = BytesStorageMetadata()
                else:
                    size = torch.Size(shape)
                    md[name] = TensorStorageMetadata(
                        properties=TensorProperties(dtype=_tensor.TORCH_OF[dtype]), size=size,
                        chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=size)])
            return Metadata(state_dict_metadata=md)
        finally:
            _L.rk_reader_close(ctypes.byref(r))

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        pass

    def prepare_local_plan(self, plan):
        return dataclasses.replace(plan, storage_data=socket.gethostname())

    def prepare_global_plan(self, plans):
        # how many ranks of each machine read each stored tensor
        count = collections.Counter((p.storage_data, _read_name(item)) for p in plans for item in p.items)
        return [dataclasses.replace(p, storage_data=_Readers(frozenset(
            _read_name(item) for item in p.items if count[(p.storage_data, _read_name(item))] > 1))) for p in plans]

    def read_data(self, plan, planner):
        sd = plan.storage_data
        shared = sd.shared if isinstance(sd, _Readers) else frozenset()
        r = self._open()
        try:
            entries = self._entries(r)
            batch = ([], [])  # requests (index, buffer tensor): [0] O_DIRECT, [1] shared
            own, straight, later = {}, [], []
            for item in plan.items:
                name = _read_name(item)
                i, dtype, shape, nbytes = entries[name]
                is_shared = name in shared if self.shared is None else self.shared
                dst = None
                if item.type != LoadItemType.BYTE_IO:
                    dst = planner.resolve_tensor(item).detach()
                    if (name not in own and tuple(item.storage_offsets) == (0,) * len(shape) and
                            tuple(item.lengths) == shape and tuple(dst.shape) == shape and dst.is_contiguous() and
                            dst.device.type == "cpu" and dst.dtype == _tensor.TORCH_OF[dtype]):
                        # the whole tensor into its destination: no tensor of its own, no copy
                        # (on a checksum mismatch the destination then holds what was read)
                        batch[is_shared].append((i, dst))
                        own[name] = dst
                        straight.append((item, dst))
                        continue
                if name not in own:
                    own[name] = _tensor.empty(dtype, shape, True)
                    batch[is_shared].append((i, own[name]))
                later.append((item, dst))
            for flags, reqs in ((0, batch[0]), (_lib.READ_SHARED, batch[1])):
                if reqs:
                    arr = (_lib.ReadReq * len(reqs))(*(_lib.ReadReq(i, t.data_ptr() if t.numel() else None,
                                                                    t.numel() * t.element_size()) for i, t in reqs))
                    _lib.call("rekindle.dcp: read %d tensors of %s" % (len(reqs), self.path),
                              _L.rk_reader_read_many(r, arr, len(reqs), flags))
            for item, dst in straight:
                planner.commit_tensor(item, dst)
            for item, dst in later:
                src = own[_read_name(item)]
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(src.numpy().tobytes()))
                    continue
                for d, (o, n) in enumerate(zip(item.storage_offsets, item.lengths)):
                    src = src.narrow(d, o, n)
                dst.copy_(src)
                planner.commit_tensor(item, dst)
        finally:
            _L.rk_reader_close(ctypes.byref(r))
        fut = Future()
        fut.set_result(None)
        return fut
