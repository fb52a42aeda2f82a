"""tests/py/nccl_load_check.py BUILD WORK - librekindle beside an NCCL other than its build's.

A process holds one libnccl.so.2, the first one loaded (torch's). This loads a stand-in
libnccl.so.2 first (built here: the functions of an older NCCL, each returning
ncclInternalError; no GPU needed), then the build's librekindle.so.1, as `import torch`
then `import rekindle` do:
  - 2.18: every function the ring needs but ncclCommShrink and ncclCommRevoke. The library
    loads (it used to fail: "undefined symbol: ncclCommShrink"), ring_nccl_load finds
    NCCL 2.18 usable, and neither a shrink nor a revoke is offered (ring_nccl_revokes).
  - 2.12: no ncclCommInitRankConfig either. The library loads, and ring_nccl_load refuses
    NCCL with RK_E_NCCL, naming the missing function (device buffers then stage).
A build without CUDA + NCCL has no NCCL path: nothing to check (said so).
Prints "nccl_load_check: ok" at the end.
"""
import ctypes
import os
import subprocess
import sys

BUILD, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
LIB = os.path.join(BUILD, "lib", "librekindle.so.1")

STUB = r'''
typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
int ncclGetVersion(int *v) { *v = VERSION; return 0; }
const char *ncclGetErrorString(int r) { (void)r; return "stand-in NCCL"; }
int ncclGetUniqueId(ncclUniqueId *id) { (void)id; return 3; }
#if VERSION >= 21400
int ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId id, int r, void *cfg)
{ (void)c; (void)n; (void)id; (void)r; (void)cfg; return 3; }
int ncclCommFinalize(ncclComm_t c) { (void)c; return 3; }
#endif
int ncclCommGetAsyncError(ncclComm_t c, int *e) { (void)c; *e = 3; return 0; }
int ncclCommDestroy(ncclComm_t c) { (void)c; return 3; }
int ncclCommAbort(ncclComm_t c) { (void)c; return 3; }
int ncclAllReduce(const void *s, void *r, unsigned long n, int t, int o, ncclComm_t c, void *st)
{ (void)s; (void)r; (void)n; (void)t; (void)o; (void)c; (void)st; return 3; }
'''

PROBE = r'''
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # torch's NCCL, loaded first
try:
    lib = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
except OSError as e:
    sys.exit("librekindle does not load beside it: %s" % e)
v, why = ctypes.c_int(0), ctypes.c_char_p()
rc = lib.ring_nccl_load(ctypes.byref(v), ctypes.byref(why))
lib.ring_nccl_revokes.restype = ctypes.c_bool
print("rc=%d version=%d revokes=%d why=%s" % (rc, v.value, lib.ring_nccl_revokes(),
      (why.value or b"").decode()))
'''


def stub(version):
    src = os.path.join(WORK, "nccl%d.c" % version)
    out = os.path.join(WORK, "nccl%d" % version, "libnccl.so.2")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(src, "w") as f:
        f.write(STUB)
    subprocess.run(["cc", "-shared", "-fPIC", "-DVERSION=%d" % version, "-Wl,-soname,libnccl.so.2", "-o", out, src],
                   check=True)
    return out


def probe(nccl):
    p = subprocess.run([sys.executable, "-c", PROBE, nccl, LIB], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    sys.stdout.write("NCCL %s: %s" % (nccl, p.stdout))
    if p.returncode != 0:
        sys.exit("nccl_load_check: FAILED beside %s" % nccl)
    return dict(kv.split("=", 1) for kv in p.stdout.strip().split(" ", 3))


def main():
    lib = ctypes.CDLL(LIB)
    if not hasattr(lib, "ring_nccl_create"):
        print("nccl_load_check: a build without CUDA + NCCL (%s): no NCCL path, nothing to load" % LIB)
        print("nccl_load_check: ok")
        return
    lib.rk_error_name.restype = ctypes.c_char_p
    nccl_e = [c for c in range(-1001, -1200, -1) if lib.rk_error_name(c) == b"RK_E_NCCL"]
    got = probe(stub(21803))
    if got["rc"] != "0" or got["version"] != "21803" or got["revokes"] != "0":
        sys.exit("nccl_load_check: NCCL 2.18 should be usable, without a revoke: %s" % got)
    got = probe(stub(21207))
    if int(got["rc"]) != nccl_e[0] or "ncclCommInitRankConfig" not in got["why"]:
        sys.exit("nccl_load_check: NCCL 2.12 should be refused, naming ncclCommInitRankConfig: %s" % got)
    print("nccl_load_check: ok")


main()
