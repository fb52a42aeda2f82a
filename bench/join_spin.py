#!/usr/bin/python3
"""bench/join_spin.py - what a join given up on costs the members' training.

  bench/join_spin.py BUILD [BUILD2 ...]   (RK_BENCH_SPIN_RUNS, default 3; RK_BENCH_SPIN_YIELD)

An elastic job of 2 rk-train workers on this host (`rekindle run
--host-discovery-script`) is offered a third slot; the worker started for it exits before
its MPI_Init, so each member's join thread stays inside MPI_Comm_spawn, polling for it
without end (recover/join.c J8, J12), and the members give the join up on the newcomer's
end record (join_proto.c J18). Rank 0's step lines are timed: the steps per second in the
3 s before the growth was asked, and in the 3 s from the members' give-up on. Their ratio
is what the thread left behind costs (1.0: nothing). With several builds (one with
recover/join.c's SCHED_IDLE, one without) the runs alternate between them, so both meet
the same machine.

Open MPI yields in its waits where mpirun knows a host is oversubscribed (as here, 2 cores,
2 workers + their threads); a host it believes has a core per rank does not. The default
RK_BENCH_SPIN_YIELD=0 (OMPI_MCA_mpi_yield_when_idle=0) measures that case; 1 the yielding one.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

WINDOW = 3.0


def one(build, yield_idle):
    w = tempfile.mkdtemp(prefix="rk-spin.")
    prog = os.path.join(w, "prog")
    with open(prog, "w") as f:
        f.write('#!/bin/sh\n[ "${RK_RUN_SLOT:-}" = 2 ] && exit 7\nexec %s/bin/rk-train "$@"\n' % build)
    os.chmod(prog, 0o700)
    hosts = os.path.join(w, "hosts")
    host = os.uname().nodename
    with open(hosts, "w") as f:
        f.write("%s:2\n" % host)
    env = dict(os.environ, RK_CKPT_DIR=w + "/c", RK_CKPT_EVERY="50", RK_KEEP="4", RK_TIMEOUT_MS="30000",
               RK_RUN_DIR=w + "/run", OMPI_MCA_mpi_yield_when_idle=str(yield_idle))
    cmd = [build + "/bin/rekindle", "run", "--host-discovery-script", "cat " + hosts, "--discovery-interval", "0.2",
           "--max-np", "3", "--", prog, "--steps", "1000000", "--seed", "8", "--hidden", "32"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps, marks = [], {}

    def read_err():
        for line in p.stderr:
            if "given up" in line and "gave_up" not in marks:
                marks["gave_up"] = time.monotonic()

    t = threading.Thread(target=read_err, daemon=True)
    t.start()
    asked = None
    deadline = time.monotonic() + 120
    for line in p.stdout:
        now = time.monotonic()
        if line.startswith("step "):
            steps.append(now)
        if asked is None and len(steps) > 200 and now - steps[200] >= WINDOW:
            with open(hosts, "w") as f:
                f.write("%s:3\n" % host)
            asked = now
        g = marks.get("gave_up")
        if (g and now - g >= WINDOW) or now > deadline:
            break
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    shutil.rmtree(w, ignore_errors=True)
    g = marks.get("gave_up")
    if asked is None or g is None:
        return None
    before = sum(1 for s in steps if asked - WINDOW <= s < asked) / WINDOW
    after = sum(1 for s in steps if g <= s < g + WINDOW) / WINDOW
    return before, after, g - asked


def main():
    builds = sys.argv[1:]
    if not builds:
        sys.exit(__doc__)
    runs = int(os.environ.get("RK_BENCH_SPIN_RUNS", "3"))
    yield_idle = int(os.environ.get("RK_BENCH_SPIN_YIELD", "0"))
    res = {b: [] for b in builds}
    for r in range(runs):
        for b in builds:
            x = one(os.path.abspath(b), yield_idle)
            if x is None:
                print("join_spin: %s run %d: no give-up seen within 120 s" % (b, r), flush=True)
                continue
            before, after, gave = x
            res[b].append(after / before if before else 0.0)
            print("join_spin: %s run %d: %.0f steps/s before, %.0f after the give-up (%.2f), given up %.2f s after "
                  "the ask" % (b, r, before, after, res[b][-1], gave), flush=True)
    for b in builds:
        v = sorted(res[b])
        if v:
            print("join_spin: %s: after/before median %.2f over %d runs (yield_when_idle=%d)" %
                  (b, v[len(v) // 2], len(v), yield_idle))


if __name__ == "__main__":
    main()
