"""The wheel's build step (pyproject.toml has the metadata): `make` builds librekindle and
the `rekindle` command into BUILD, then both are packed inside the package as
rekindle/_native/librekindle.so.<ABI> and rekindle/_native/rekindle; the Python entry point
`rekindle` (rekindle/_cli.py) runs the latter, and rekindle/_lib.py loads the former.

Environment:
  REKINDLE_BUILD     the Makefile's build directory (default build: `make wheel` passes its
                     own BUILD, already built, so make has nothing left to do)
  REKINDLE_MAKE      the make command (default make)
  REKINDLE_WORK      where setuptools' own files go (default BUILD/wheel: the build, the
                     bdist tree and the egg-info stay out of the source tree)

The tag is py3-none-linux_<arch>: the package is pure Python over ctypes (any CPython 3),
the files it carries are the platform's and link the system's Open MPI, HDF5 and liburing.
"""
import os
import re
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - setuptools >= 70 carries its own
    from setuptools.command.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("REKINDLE_BUILD") or "build"
BUILD_DIR = BUILD if os.path.isabs(BUILD) else os.path.join(HERE, BUILD)
WORK = os.environ.get("REKINDLE_WORK") or os.path.join(BUILD_DIR, "wheel")


def header_define(name):
    with open(os.path.join(HERE, "include", "rekindle.h")) as f:
        m = re.search(r"^#define %s (\S+)" % name, f.read(), re.M)
    if not m:
        raise RuntimeError("include/rekindle.h: no #define %s" % name)
    return m.group(1).strip('"')


VERSION = header_define("REKINDLE_VERSION_STRING")
ABI = header_define("REKINDLE_ABI_VERSION")


class BuildWithMake(build_py):
    """build_py, then the library and the command from the Makefile, into the package."""

    def run(self):
        super().run()
        make = os.environ.get("REKINDLE_MAKE") or "make"
        subprocess.run([make, "--no-print-directory", "-C", HERE, "BUILD=" + BUILD, "all"], check=True)
        native = os.path.join(self.build_lib, "rekindle", "_native")
        os.makedirs(native, exist_ok=True)
        lib = os.path.join(BUILD_DIR, "lib", "librekindle.so")
        shutil.copyfile(lib, os.path.join(native, "librekindle.so.%s" % ABI))
        cli = os.path.join(native, "rekindle")
        shutil.copyfile(os.path.join(BUILD_DIR, "bin", "rekindle"), cli)
        os.chmod(cli, 0o755)


class WorkEggInfo(egg_info):
    def initialize_options(self):
        super().initialize_options()
        os.makedirs(WORK, exist_ok=True)
        self.egg_base = os.path.relpath(WORK, HERE)


class PlatformDistribution(Distribution):
    def has_ext_modules(self):
        return True  # it carries the platform's files: platlib, a platform tag


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat  # no extension module: any CPython 3 (ctypes)


setup(
    version=VERSION,
    distclass=PlatformDistribution,
    cmdclass={"build_py": BuildWithMake, "egg_info": WorkEggInfo, "bdist_wheel": PlatformWheel},
    options={"build": {"build_base": os.path.join(WORK, "build")},
             "bdist_wheel": {"bdist_dir": os.path.join(WORK, "bdist")}},
)
