"""tests/py/procs.py - the processes of a job under test, read from /proc, and the
elastic job's hosts list and hold: for tests/py/job_check.py and tests/py/grow_check.py."""
import os
import re
import socket
import time

# What says a growth onto a worker started while the job trains is decided: the members'
# join thread at RK_LOG=info (recover/join.c), or the launcher giving the growth in place
# up (tools/run_grow.c, "growth in place to N workers did not complete").
JOIN_DECIDED = ("join: 1 worker(s) spawned and merged", "did not complete")


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


def list_slots(path, slots):
    """The discovery script's list (`cat path`): this host with `slots` slots, replaced whole."""
    with open(path + ".tmp", "w") as f:
        f.write("%s:%d\n" % (socket.gethostname(), slots))
    os.rename(path + ".tmp", path)


def held_env(hold, at):
    """The environment that holds each worker at its `at`-th rk_step_done while the file
    `hold` exists (made here): a job whose workers would end before a worker started to
    grow it has imported its torch (a cold cache) waits for it (wait_join_decided)."""
    open(hold, "w").close()
    return {"RK_FAULT": "step_done@%d=hang" % at, "RK_FAULT_HOLD": hold, "RK_LOG": "info"}


def wait_join_decided(proc, lines, bound_s):
    """Until a line of the job's output (lines, as they come) says JOIN_DECIDED, the job
    ended, or bound_s passed."""
    until = time.time() + bound_s
    while time.time() < until and proc.poll() is None and not any(
            d in l for l in list(lines) for d in JOIN_DECIDED):
        time.sleep(0.05)
