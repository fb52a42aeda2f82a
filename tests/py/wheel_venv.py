"""tests/py/wheel_venv.py - the wheel as a user installs it, for the checks that run
programs from it (tests/py/wheel_check.py, tests/py/job_check.py's venv modes).

make(BUILD, WORK, python) builds dist/rekindle-*.whl from the source tree offline
(Debian's pip, setuptools and wheel: `pip wheel --no-build-isolation --no-deps --no-index`,
over the library and command BUILD holds), checks its name and metadata, and installs it
with `pip install --no-index --no-deps` into a NEW virtual environment WORK/venv that sees
`python`'s torch and numpy and nothing else of Rekindle's:

  - `python` a base interpreter (Debian's /usr/bin/python3): `python -m venv
    --system-site-packages`, so the system's torch (1.13), numpy and h5py are seen;
  - `python` itself a venv (bench/peers/venv: PyPI's torch 2.x): a venv of its base
    interpreter, without the system's site-packages, and a .pth file naming `python`'s
    site-packages, so that torch is seen and Debian's is not.

What is fresh: the venv, and rekindle in it, which comes from the wheel alone. Nothing is
downloaded (torch is never installed here). env() is the environment to run the venv's
programs in: none of PYTHONPATH, LD_LIBRARY_PATH or REKINDLE_LIB (the checks' own harness
sets the first two to the source tree's package and the build's library).
"""
import glob
import os
import subprocess
import sys
import zipfile

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
FOREIGN = ("PYTHONPATH", "LD_LIBRARY_PATH", "REKINDLE_LIB")


def env():
    return {k: v for k, v in os.environ.items() if k not in FOREIGN}


def run(argv, env=None, cwd=None, what="wheel_venv"):
    p = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=400)
    sys.stdout.write("$ %s\n%s" % (" ".join(argv), p.stdout))
    if p.returncode != 0:
        sys.exit("%s: %s exited %d" % (what, argv[0], p.returncode))
    return p.stdout


def _site_packages(python):
    """python's own site-packages (purelib, platlib), and whether it is a venv."""
    out = subprocess.run([python, "-c", "import sys, sysconfig; p = sysconfig.get_paths(); "
                          "print(sys.prefix != sys.base_prefix); print(p['purelib']); print(p['platlib']); "
                          "print(sys.base_prefix); print('%d.%d' % sys.version_info[:2])"],
                         env=env(), stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.split("\n")
    return out[0] == "True", sorted(set(out[1:3])), out[3], out[4]


def make(build, work, python=None, what="wheel_venv"):
    """Builds and installs the wheel into WORK/venv; returns (venv, its python, its rekindle)."""
    python = python or BASE
    os.makedirs(work, exist_ok=True)
    dist = os.path.join(work, "dist")
    run([BASE, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", "--no-index", "-w", dist, SRC],
        env=dict(env(), REKINDLE_BUILD=build, REKINDLE_WORK=os.path.join(work, "setuptools"),
                 SANITIZE=os.environ.get("RK_TEST_SANITIZE") or "0", TSAN=os.environ.get("RK_TEST_TSAN") or "0"),
        cwd=work, what=what)  # (make's flags as the build under test's, should make find anything to do)
    wheels = glob.glob(os.path.join(dist, "rekindle-*.whl"))
    if len(wheels) != 1 or not os.path.basename(wheels[0]).endswith("-py3-none-linux_x86_64.whl"):
        sys.exit("%s: want one rekindle-*-py3-none-linux_x86_64.whl, have %s" % (what, wheels))
    with zipfile.ZipFile(wheels[0]) as z:
        names = set(z.namelist())
        meta = z.read([n for n in names if n.endswith(".dist-info/METADATA")][0]).decode()
        entry = z.read([n for n in names if n.endswith(".dist-info/entry_points.txt")][0]).decode()
    for want in ("rekindle/__init__.py", "rekindle/_native/librekindle.so.1", "rekindle/_native/rekindle"):
        if want not in names:
            sys.exit("%s: %s is not in the wheel" % (what, want))
    for want in ("Requires-Dist: numpy", "Provides-Extra: torch"):
        if want not in meta:
            sys.exit("%s: the metadata lacks %r:\n%s" % (what, want, meta))
    if "rekindle = rekindle._cli:main" not in entry:
        sys.exit("%s: no rekindle command in %r" % (what, entry))

    venv = os.path.join(work, "venv")
    is_venv, sites, base_prefix, version = _site_packages(python)
    if is_venv:
        base = os.path.join(base_prefix, "bin", "python" + version)
        run([base, "-m", "venv", venv], env=env(), what=what)
        mine = glob.glob(os.path.join(venv, "lib", "python*", "site-packages"))
        if len(mine) != 1:
            sys.exit("%s: the new venv's site-packages: %s" % (what, mine))
        with open(os.path.join(mine[0], "_rekindle_test_torch.pth"), "w") as f:
            f.write("".join(s + "\n" for s in sites))
    else:
        run([python, "-m", "venv", "--system-site-packages", venv], env=env(), what=what)
    py, cmd = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "rekindle")
    run([py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", wheels[0]], env=env(), what=what)
    return venv, py, cmd
