#!/usr/bin/env python3
"""bench/zero.py BUILD - sharded state (ZeRO-1) on 4 workers, run by bench/zero.sh.

(a) Memory per rank, measured: rk-train --mem with and without --zero (VmHWM after the
    last step, before the final hash), minus the same program's VmHWM at --hidden 1 (the
    runtime: MPI, the library, the detector), against ZeRO-1's theoretical figure for the
    same P and N (parameters 4P + gradients 4P + this rank's Adam moments 8P/N, f32).
(b) Rebuild of a lost rank's shard (bench/bench_zero: a sharded tensor of MIB MiB per
    rank, one rank SIGKILLed after a committed checkpoint) from the survivors' memory,
    against the same job rolled back from disk (RK_ROLLBACK=disk) with a warm and with a
    dropped page cache, and against an O_DIRECT read of the lost rank's shard file alone.

Environment: RK_BENCH_ZERO_HIDDEN (4096), RK_BENCH_ZERO_MIB (512; at 1024 the survivors, each about 5x its shard at its peak, need about 17 GB), RK_BENCH_ZERO_PARTS
("mem rebuild"). RK_HEARTBEAT_MS / RK_TIMEOUT_MS pass through (defaults here: 1000 / 600000).
"""
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
N = 4
HIDDEN = int(os.environ.get("RK_BENCH_ZERO_HIDDEN", "4096"))
MIB = int(os.environ.get("RK_BENCH_ZERO_MIB", "512"))
PARTS = os.environ.get("RK_BENCH_ZERO_PARTS", "mem rebuild").split()
TMP = os.environ.get("RK_BENCH_TMP", "/var/tmp")


def env_for(work, **extra):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", RK_CKPT_DIR=work + "/ckpt",
               RK_EVENT_LOG=work + "/ev")
    env.setdefault("RK_TIMEOUT_MS", "600000")
    # Detection is not what this measures: a long period keeps a loaded 2-core machine from
    # declaring a busy survivor dead in the middle of a rebuild (bench/det.sh measures it).
    env.setdefault("RK_HEARTBEAT_MS", "1000")
    env.update(extra)
    return env


def run(work, argv, **extra):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    p = subprocess.run([BUILD + "/bin/rekindle", "run", "-n", str(N), "--"] + argv, env=env_for(work, **extra),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    return p.stdout, p.stderr


def gb(b):
    return "%.3f GB" % (b / 1e9)


# ---- (a) memory ----------------------------------------------------------------------------

def mem_run(work, hidden, zero):
    argv = [BUILD + "/bin/rk-train", "--steps", "4", "--hidden", str(hidden), "--layers", "3", "--batch", "8", "--mem"]
    out, err = run(work, argv + (["--zero"] if zero else []), RK_CKPT_EVERY="2")
    rows = [dict((k, int(v)) for k, v in re.findall(r"(\w+)=(-?\d+)", l)) for l in out.splitlines()
            if l.startswith("memory ")]
    if len(rows) != N:
        sys.exit("zero: rk-train --mem printed %d memory lines:\n%s%s" % (len(rows), out[-2000:], err[-2000:]))
    return rows


def part_mem(work):
    print("(a) memory per rank: rk-train --hidden %d --layers 3, %d workers, a checkpoint every 2 steps" % (HIDDEN, N))
    res = {}
    for zero in (False, True):
        base = statistics.median(r["hwm"] for r in mem_run(work, 1, zero))
        rows = mem_run(work, HIDDEN, zero)
        res[zero] = (base, rows)
    P = res[False][1][0]["params"] // 4
    print("  P = %d parameters (f32), N = %d; runtime alone (--hidden 1): %s / %s" %
          (P, N, gb(res[False][0]), gb(res[True][0])))
    print("  %-38s %14s %14s" % ("per rank (median of ranks)", "without --zero", "--zero"))
    line = {}
    for zero in (False, True):
        base, rows = res[zero]
        hwm = statistics.median(r["hwm"] for r in rows)
        app = statistics.median(r["params"] + r["grads"] + r["moments"] for r in rows)
        moments = statistics.median(r["moments"] for r in rows)
        line[zero] = dict(total=hwm - base, app=app, moments=moments, lib=hwm - base - app)
    for key, what in (("app", "trainer arrays (params, grads, m, v)"), ("moments", "  of which Adam m and v"),
                      ("lib", "the rest (library: snapshot, partner)"), ("total", "measured peak - runtime")):
        a, b = line[False][key], line[True][key]
        print("  %-38s %14s %14s   (%.2f / %.2f bytes per parameter)" % (what, gb(a), gb(b), a / P, b / P))
    zero1 = 8 * P + 8 * P / N
    ddp = 16 * P
    print("  ZeRO-1's theoretical state (4P params + 4P grads + 8P/N moments): %s = %.2f B/param" % (gb(zero1), zero1 / P))
    # The library holds a snapshot of the registered state (parameters and moments; the
    # gradients are not registered) and, with --zero, the left neighbour's m and v slices.
    print("  expected library share: without --zero the snapshot 12P = %s (measured %s); with --zero the "
          "snapshot 4P + 8P/N and the partner copy 8P/N = %s (measured %s)" %
          (gb(12 * P), gb(line[False]["lib"]), gb(4 * P + 16 * P / N), gb(line[True]["lib"])))
    print("RESULT mem P=%d zero_total=%d plain_total=%d zero1=%d ratio_zero_to_zero1=%.3f ratio_plain_to_ddp_state=%.3f"
          % (P, line[True]["total"], line[False]["total"], zero1, line[True]["total"] / zero1, line[False]["total"] / ddp))


# ---- (b) rebuild ---------------------------------------------------------------------------

def events(work):
    ev = []
    for f in glob.glob(work + "/ev.*"):
        for l in open(f):
            try:
                ev.append(json.loads(l))
            except ValueError:
                pass
    return ev


def rebuild_run(work, mode):
    victim = 1
    extra = {"RK_CKPT_EVERY": "0"}
    argv = [BUILD + "/bench/bench_zero", str(MIB), str(victim)]
    if mode != "memory":
        extra["RK_ROLLBACK"] = "disk"
    if mode == "disk, cold cache":
        argv.append("drop")
    out, err = run(work, argv, **extra)
    kill = [int(x) for x in re.findall(r"kill_ns=(\d+)", out)]
    surv = [dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", l)) for l in out.splitlines()
            if l.startswith("survivor ")]
    raw = re.search(r"raw_read bytes=(\d+) s=([\d.]+)", out)
    bad = [l for l in out.splitlines() if l.startswith("survivor ") and not l.endswith(" ok")]
    if not kill or len(surv) != N - 1 or bad or not raw:
        sys.exit("zero: bench_zero (%s) failed:\n%s\n%s" % (mode, out[-3000:], err[-3000:]))
    ev = events(work)
    k = kill[0]
    dead = min(e["t_ns"] for e in ev if e["event"] == "peer_dead" and e["t_ns"] >= k)
    rebuilt = {e["rank"]: e["t_ns"] for e in ev if e["event"] == "ring_rebuilt"}
    resumed = [e for e in ev if e["event"] == "resumed"]
    roll = max(e["t_ns"] - rebuilt[e["rank"]] for e in resumed) / 1e9
    return dict(detect=(dead - k) / 1e9, roll=roll, src=resumed[0].get("from"),
                rebind=max(s["rebound_ns"] - s["recovered_ns"] for s in surv) / 1e9,
                total=(max(s["rebound_ns"] for s in surv) - k) / 1e9, hwm=max(s["hwm"] for s in surv),
                raw_bytes=int(raw.group(1)), raw_s=float(raw.group(2)))


def part_rebuild(work):
    print("(b) a lost rank's shard: %d workers, %d MiB of a sharded tensor each (%d MiB global), rank 1 SIGKILLed"
          % (N, MIB, N * MIB))
    print("  %-20s %8s %10s %12s %10s %12s %12s" % ("rollback", "from", "detect s", "rollback s", "rebind s",
                                                   "kill->ok s", "peak RSS"))
    r = {}
    for mode in ("memory", "disk, warm cache", "disk, cold cache"):
        x = r[mode] = rebuild_run(work, mode)
        print("  %-20s %8s %10.3f %12.3f %10.3f %12.3f %12s" % (mode, x["src"], x["detect"], x["roll"], x["rebind"],
                                                              x["total"], gb(x["hwm"])))
    cold = r["disk, cold cache"]
    print("  O_DIRECT read of the lost rank's shard file alone (cold): %s in %.3f s = %.2f GB/s"
          % (gb(cold["raw_bytes"]), cold["raw_s"], cold["raw_bytes"] / cold["raw_s"] / 1e9))
    m = r["memory"]["roll"]
    print("  rebuild from memory / rollback from disk: %.2f (warm cache), %.2f (cold cache); "
          "/ O_DIRECT read of the lost shard: %.2f" % (m / r["disk, warm cache"]["roll"], m / cold["roll"],
                                                      m / cold["raw_s"]))
    print("RESULT rebuild mib=%d memory_s=%.3f disk_warm_s=%.3f disk_cold_s=%.3f raw_read_s=%.3f"
          % (MIB, m, r["disk, warm cache"]["roll"], cold["roll"], cold["raw_s"]))


def main():
    work = tempfile.mkdtemp(prefix="rk-bench-zero-", dir=TMP)
    try:
        if "mem" in PARTS:
            part_mem(work + "/run")
        if "rebuild" in PARTS:
            part_rebuild(work + "/run")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
