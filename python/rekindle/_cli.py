"""The `rekindle` command of an installed wheel: the entry point runs the program the wheel
carries (rekindle/_native/rekindle, the same as the build's build/bin/rekindle) with the
same arguments, in place of this interpreter."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native", "rekindle")
    if not os.access(exe, os.X_OK):
        sys.stderr.write("rekindle: %s is missing: this package was not installed from a wheel "
                         "(make wheel; or use build/bin/rekindle)\n" % exe)
        return 2
    os.execv(exe, ["rekindle"] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
