#!/usr/bin/python3
"""bench/recover.py BUILD - how long a 4-worker rk-train job takes to train again after
one worker is SIGKILLed, measured from the kill (CLOCK_REALTIME, taken right before
kill(2)) to the survivors' events (contract section 5):

  kill -> peer_dead     the first survivor declares the victim dead
  kill -> ring_rebuilt  the last survivor has the new ring
  kill -> resumed       the last survivor has the rolled-back state: training again
  steps lost            the survivors' step before the loss minus the step resumed

for three ways back: in-memory rollback (the default), disk rollback (RK_ROLLBACK=disk:
the newest committed checkpoint, verified), and, for comparison, killing the whole job
and relaunching it (rekindle run --max-restarts 1: a new job resumes from disk).

Environment: RK_BENCH_KILLS (memory runs, default 20), RK_BENCH_DISK (10),
RK_BENCH_RELAUNCH (5), RK_BENCH_STEPS (600), RK_BENCH_HIDDEN (256), RK_BENCH_DEVICE (cpu,
or cuda: the four workers' model on the GPU, its gradients through NCCL, which a loss
aborts and a recovery shrinks or makes again: bench/recover_cuda.sh).
"""
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
STEPS = int(os.environ.get("RK_BENCH_STEPS", "600"))
HIDDEN = os.environ.get("RK_BENCH_HIDDEN", "256")
DEVICE = os.environ.get("RK_BENCH_DEVICE", "cpu")
WORKERS = 4


def workers_of(run_tag):
    """pid -> rank of the rk-train processes of this run (tagged through the environment)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % pid) as f:
                if f.read().strip() != "rk-train":
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"RK_BENCH_TAG") == run_tag.encode():
            out[int(pid)] = int(env.get(b"OMPI_COMM_WORLD_RANK", b"-1"))
    return out


def events(prefix):
    ev = []
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            for line in f:
                try:
                    ev.append(json.loads(line))
                except ValueError:
                    pass
    return ev


def one_run(mode, seed):
    rnd = random.Random(seed)
    work = tempfile.mkdtemp(prefix="rk-bench-recover-")
    tag = "%s-%d-%d" % (mode, seed, os.getpid())
    env = dict(os.environ, RK_CKPT_DIR=work + "/ckpt", RK_CKPT_EVERY="25", RK_EVENT_LOG=work + "/ev",
               RK_BENCH_TAG=tag, RK_TIMEOUT_MS="10000", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if mode == "disk":
        env["RK_ROLLBACK"] = "disk"
    cmd = [BUILD + "/bin/rekindle", "run", "-n", str(WORKERS)]
    if mode == "relaunch":
        cmd += ["--max-restarts", "1"]
    cmd += ["--", BUILD + "/bin/rk-train", "--steps", str(STEPS), "--hidden", HIDDEN, "--device", DEVICE]
    out = open(work + "/out", "w+")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL, start_new_session=True)
    kill_at = rnd.randint(STEPS // 4, STEPS // 2)
    kill_ns, before = None, None
    deadline = time.time() + 120
    try:
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.005)
            if kill_ns is not None:
                continue
            out.seek(0)
            lines = [l for l in out.read().splitlines() if l.startswith("step ")]
            if not lines or int(lines[-1].split()[1]) < kill_at:
                continue
            pids = workers_of(tag)
            if len(pids) < WORKERS:
                continue
            if mode == "relaunch":
                victims = list(pids)
            else:
                victims = [rnd.choice(list(pids))]
            before = int(lines[-1].split()[1])
            kill_ns = time.time_ns()
            for p in victims:
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            return None
    finally:
        out.close()
    ev = events(work + "/ev")
    after = [e for e in ev if e["t_ns"] >= (kill_ns or 0)]
    dead = [e["t_ns"] for e in after if e["event"] == "peer_dead"]
    rebuilt = [e["t_ns"] for e in after if e["event"] == "ring_rebuilt"]
    resumed = [e for e in after if e["event"] == "resumed"]
    if kill_ns is None or not resumed:
        return None
    r = {"mode": mode, "from": sorted({e["from"] for e in resumed}),
         "resumed_ms": (max(e["t_ns"] for e in resumed) - kill_ns) / 1e6,
         "steps_lost": max(0, before + 1 - min(e["step"] for e in resumed))}
    if dead:
        r["dead_ms"] = (min(dead) - kill_ns) / 1e6
    if rebuilt:
        r["rebuilt_ms"] = (max(rebuilt) - kill_ns) / 1e6
    subprocess.run(["rm", "-rf", work])
    return r


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def report(name, runs, key):
    xs = [r[key] for r in runs if key in r]
    if not xs:
        return
    print("  %-10s %-14s n=%-3d p50 %8.1f  p90 %8.1f  max %8.1f" % (name, key, len(xs), pct(xs, 50), pct(xs, 90),
                                                                    max(xs)))


def main():
    plan = [("memory", int(os.environ.get("RK_BENCH_KILLS", "20"))),
            ("disk", int(os.environ.get("RK_BENCH_DISK", "10"))),
            ("relaunch", int(os.environ.get("RK_BENCH_RELAUNCH", "5")))]
    print("recover: %d workers, rk-train --steps %d --hidden %s --device %s, checkpoint every 25 steps, "
          "one SIGKILL per run" % (WORKERS, STEPS, HIDDEN, DEVICE))
    results = {}
    for mode, n in plan:
        runs = []
        for i in range(n):
            r = one_run(mode, 1000 * len(mode) + i)
            if r is None:
                print("  %s run %d: no resume observed (job failed or timed out)" % (mode, i), flush=True)
            else:
                runs.append(r)
                print("  %s run %d: resumed from %s after %.1f ms, %d steps lost" % (
                    mode, i, "+".join(r["from"]), r["resumed_ms"], r["steps_lost"]), flush=True)
        results[mode] = runs
        print("%s (%d runs; resumed from %s):" % (mode, len(runs), sorted({f for r in runs for f in r["from"]})))
        for key in ("dead_ms", "rebuilt_ms", "resumed_ms", "steps_lost"):
            report(mode, runs, key)
    mem = [r["resumed_ms"] for r in results.get("memory", [])]
    rel = [r["resumed_ms"] for r in results.get("relaunch", [])]
    if mem and rel:
        print("recover: --device %s: kill -> training again, p50: in-memory" % DEVICE +
              " %.0f ms vs full relaunch %.0f ms (%.1fx faster); "
              "goal <= 1000 ms in memory: %s" % (pct(mem, 50), pct(rel, 50), pct(rel, 50) / pct(mem, 50),
                                                 "met" if pct(mem, 90) <= 1000 else "NOT met (p90 %.0f ms)" % pct(mem, 90)))
    with open(os.environ.get("RK_BENCH_JSON", "/dev/null"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
