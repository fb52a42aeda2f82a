"""tests/py/venv_origin.py VENV [--crash-at R:POINT@N] [--seed S] PROGRAM [ARGS...] - runs PROGRAM as `python
PROGRAM ARGS` would (runpy, as __main__, sys.argv[0] PROGRAM), in a worker of a job run by
tests/py/job_check.py's venv modes, then says where its rekindle came from:

    venv_origin: rank R: rekindle from VENV

and exits 3 instead when the package or librekindle the program loaded is not VENV's, or
when PYTHONPATH or REKINDLE_LIB is set, or LD_LIBRARY_PATH names a directory that holds a
librekindle. Nothing of rekindle is imported
before the program runs, so the program's own imports decide (a program that put the
source tree on sys.path would be caught here). --seed S: torch.manual_seed(S) first, for a
program that draws its data and model from torch's unseeded generator (PyTorch's DDP
tutorial): the same draws on every rank and in the replay.

--crash-at R:POINT@N: the worker of launch rank R, in the job's first launch only
(RK_RUN_ATTEMPT 0), SIGKILLs itself at a point of its own progress, the same in every run
(a kill from outside, triggered by the job's output, races the job to its end):
  allreduce@N  the library's fault point: RK_FAULT=allreduce@N=crash, raise(SIGKILL) in its
               (N+1)th rk_allreduce (common/fault.c);
  step@N       after its Nth optimizer step (torch >= 2's global optimizer step hook).
"""
import os
import runpy
import sys

venv, args = os.path.realpath(sys.argv[1]), sys.argv[2:]
if args[0] == "--crash-at":
    rank, point = args[1].split(":")
    what, n = point.split("@")
    if os.environ.get("OMPI_COMM_WORLD_RANK") == rank and os.environ.get("RK_RUN_ATTEMPT", "0") == "0":
        if what == "allreduce":
            os.environ["RK_FAULT"] = "allreduce@%s=crash" % n
        else:
            import signal
            import torch.optim.optimizer as o
            steps = [0]

            def crash(*_):
                steps[0] += 1
                if steps[0] == int(n):
                    os.kill(os.getpid(), signal.SIGKILL)
            o.register_optimizer_step_post_hook(crash)
    args = args[2:]
if args[0] == "--seed":
    import torch
    torch.manual_seed(int(args[1]))
    args = args[2:]
# mpirun sets LD_LIBRARY_PATH to Open MPI's own library directory (/usr/lib:/usr/lib on
# Debian): set, it is refused only where one of its directories holds a librekindle.
bad = [k for k in ("PYTHONPATH", "REKINDLE_LIB") if k in os.environ] + [
    "LD_LIBRARY_PATH=" + d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")
    if d and any(f.startswith("librekindle") for f in (os.listdir(d) if os.path.isdir(d) else ()))]
if bad:
    sys.exit("venv_origin: %s set: the program's rekindle may not be the venv's alone" % ", ".join(bad))
sys.argv = args
sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
code = 0
try:
    runpy.run_path(args[0], run_name="__main__")
except SystemExit as e:
    code = e.code
rk = sys.modules.get("rekindle")
lib = sys.modules.get("rekindle._lib")
where = [("package", rk and rk.__file__), ("library", lib and lib.lib._name)]
for what, path in where:
    if not path or not os.path.realpath(path).startswith(venv + os.sep):
        print("venv_origin: the %s is %s, not the venv's (%s)" % (what, path, venv), flush=True)
        sys.exit(3)
print("venv_origin: rank %s: rekindle from %s" % (os.environ.get("OMPI_COMM_WORLD_RANK", "?"), venv), flush=True)
sys.exit(code)
