"""tests/py/wheel_check.py BUILD WORK - the wheel as a user installs it.

Builds dist/rekindle-*.whl from the source tree offline, checks its name and metadata and
installs it into a fresh venv that sees this interpreter's numpy (tests/py/wheel_venv.py
says how, and what is fresh), and runs
a 2-worker job with the venv's `rekindle run` and the venv's python, with no PYTHONPATH,
LD_LIBRARY_PATH or REKINDLE_LIB: every worker's package and library are the venv's. Then
the venv's `rekindle ls` and `rekindle verify` on what the job wrote.
Prints "wheel_check: ok" at the end.
"""
import os
import sys

import wheel_venv

BUILD, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])

JOB = r'''
import os, sys
import numpy as np
import rekindle, rekindle._lib as L
venv = sys.argv[1]
for what, path in (("package", rekindle.__file__), ("library", L.lib._name)):
    if not os.path.realpath(path).startswith(os.path.realpath(venv) + os.sep):
        sys.exit("wheel job: the %s is %s, not the venv's" % (what, path))
with rekindle.init(ckpt_dir=sys.argv[2], ckpt_every=5) as rk:
    w = np.zeros(64, dtype=np.float32)
    rk.register("model/w", w)
    step = rk.resume()
    while step < 20:
        g = np.full(64, float(rk.rank + 1), dtype=np.float32)
        rk.allreduce(g)
        w += g
        rk.step_done(step)
        step += 1
    want = 20 * (1 + rk.world) / 2.0
    if not np.all(w == want):
        sys.exit("wheel job: w = %r, want %r" % (w[:4], want))
    if rk.rank == 0:
        print("wheel job: ok, world %d, library %s" % (rk.world, L.lib._name), flush=True)
'''


def run(argv, env=None, cwd=None):
    return wheel_venv.run(argv, env, cwd, "wheel_check")


def main():
    venv, py, cmd = wheel_venv.make(BUILD, WORK, sys.executable, "wheel_check")
    env = wheel_venv.env()
    job = os.path.join(WORK, "job.py")
    with open(job, "w") as f:
        f.write(JOB)
    ckpt = os.path.join(WORK, "ckpt")
    out = run([cmd, "run", "-n", "2", "--", py, job, venv, ckpt], env=env, cwd=WORK)
    if "wheel job: ok, world 2" not in out:
        sys.exit("wheel_check: the job did not finish")
    if "step" not in run([cmd, "ls", ckpt], env=env, cwd=WORK):
        sys.exit("wheel_check: rekindle ls listed nothing")
    run([cmd, "verify", ckpt], env=env, cwd=WORK)
    print("wheel_check: ok")


main()
