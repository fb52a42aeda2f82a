"""tests/py/procs.py - the processes of a job under test, read from /proc: for
tests/py/job_check.py and tests/py/grow_check.py."""
import os
import re


def workers(pattern):
    """The pids whose command line (arguments joined by spaces, as pgrep -f sees it)
    matches pattern. Read from /proc here, not by running pgrep: under SANITIZE=1 this
    interpreter has ASan's runtime preloaded, which every child inherits, and pgrep hangs
    in it."""
    rx, pids = re.compile(pattern), []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if rx.search(cmd):
            pids.append(int(d))
    return pids


def mpi_rank(pid):
    """The worker's rank in the launch (spares are the last ones), None if unknown."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        return int(env[b"OMPI_COMM_WORLD_RANK"])
    except (OSError, KeyError, ValueError):
        return None
