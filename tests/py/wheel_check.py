"""tests/py/wheel_check.py BUILD WORK - the wheel as a user installs it.

Builds dist/rekindle-*.whl from the source tree offline (Debian's pip, setuptools and
wheel: `pip wheel --no-build-isolation --no-deps --no-index`, over the library and command
BUILD holds), checks its name and metadata, installs it into a fresh
`python3 -m venv --system-site-packages` with `pip install --no-index --no-deps`, and runs
a 2-worker job with the venv's `rekindle run` and the venv's python, with no PYTHONPATH,
LD_LIBRARY_PATH or REKINDLE_LIB: every worker's package and library are the venv's. Then
the venv's `rekindle ls` and `rekindle verify` on what the job wrote.
Prints "wheel_check: ok" at the end.
"""
import glob
import os
import subprocess
import sys
import zipfile

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
BASE = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"

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
    p = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=400)
    sys.stdout.write("$ %s\n%s" % (" ".join(argv), p.stdout))
    if p.returncode != 0:
        sys.exit("wheel_check: %s exited %d" % (argv[0], p.returncode))
    return p.stdout


def main():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "REKINDLE_LIB")}
    dist = os.path.join(WORK, "dist")
    run([BASE, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", "--no-index", "-w", dist, SRC],
        env=dict(env, REKINDLE_BUILD=BUILD, REKINDLE_WORK=os.path.join(WORK, "setuptools"),
                 SANITIZE=os.environ.get("RK_TEST_SANITIZE") or "0", TSAN=os.environ.get("RK_TEST_TSAN") or "0"),
        cwd=WORK)  # (make's flags as the build under test's, should make find anything to do)
    wheels = glob.glob(os.path.join(dist, "rekindle-*.whl"))
    if len(wheels) != 1 or not os.path.basename(wheels[0]).endswith("-py3-none-linux_x86_64.whl"):
        sys.exit("wheel_check: want one rekindle-*-py3-none-linux_x86_64.whl, have %s" % wheels)
    with zipfile.ZipFile(wheels[0]) as z:
        names = set(z.namelist())
        meta = z.read([n for n in names if n.endswith(".dist-info/METADATA")][0]).decode()
        entry = z.read([n for n in names if n.endswith(".dist-info/entry_points.txt")][0]).decode()
    for want in ("rekindle/__init__.py", "rekindle/_native/librekindle.so.1", "rekindle/_native/rekindle"):
        if want not in names:
            sys.exit("wheel_check: %s is not in the wheel" % want)
    for want in ("Requires-Dist: numpy", "Provides-Extra: torch"):
        if want not in meta:
            sys.exit("wheel_check: the metadata lacks %r:\n%s" % (want, meta))
    if "rekindle = rekindle._cli:main" not in entry:
        sys.exit("wheel_check: no rekindle command in %r" % entry)

    venv = os.path.join(WORK, "venv")
    run([BASE, "-m", "venv", "--system-site-packages", venv], env=env)
    py, cmd = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "rekindle")
    run([py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", wheels[0]], env=env)
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
