#!/usr/bin/env python3
"""bench/snapshot.py BUILD [--sizes 64,512] [--ranks 4] [--steps N] [--pairs P] [--batch B] [--torch H] [--device cuda]

Snapshots at every step (RK_SNAPSHOT_EVERY=1, the default) against none
(RK_SNAPSHOT_EVERY=0), on rk-train with no disk checkpoint in between (RK_CKPT_EVERY=0).
For each size of state per rank (MiB of parameters + Adam's m and v: 12 bytes a
parameter), P pairs of measurements, the two kinds alternated so that the machine's noise
falls on both. A measurement: the time a step takes, as the difference of a run of 2N
steps and one of N (start-up and the end cancel out), and from the event log's
`snapshots` event the time training waited for the snapshots' copies (in rk_allreduce and
rk_step_done; per step, the slowest rank). Prints one line per size: the median time a
step of each kind, their ratio, the wait a step. Then the peak resident memory of a rank
per parameter with and without (rk-train --mem; the runtime of a 1-wide model
subtracted), beside the 16 bytes a parameter that the state and its gradients take.
With --torch H: the same on examples/torch_train.py at --hidden H (its MLP on the
digits, Adam) instead of rk-train, and no memory figure. With --device cuda: the model,
its gradients and Adam's state on the GPU (rk-train --device cuda, torch_train.py
--device cuda; each snapshot a copy from the device into pinned host memory), no memory
figure, and the time a step from rank 0's step lines (per_step); the interpreter of torch_train.py is $RK_TEST_PYTHON (default /usr/bin/python3) and
its data $RK_TEST_DIGITS where set. Exit 0; a failed run stops it with its command line.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def shape_for(mib):
    """(hidden, layers) of an rk-train model whose parameters + m + v come near `mib` MiB
    (16 -> H -> ... -> H -> 4: its layers - 2 square H x H layers hold nearly all of them)."""
    params = mib * 2 ** 20 // 12
    hidden = 1024 if mib <= 128 else 2048 if mib <= 1024 else 4096
    return hidden, min(16, 2 + max(1, round(params / (hidden * hidden))))


def run(a, hidden, layers, every, steps, mem=False):
    """(wall seconds, ms waited for copies a snapshot on the slowest rank) of one run; with
    mem, (a rank's peak RSS, parameters)."""
    work = tempfile.mkdtemp(prefix="rk-bench-snap.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RK_")}
    env.update({"RK_CKPT_DIR": os.path.join(work, "c"), "RK_CKPT_EVERY": "0", "RK_SNAPSHOT_EVERY": str(every),
                "RK_EVENT_LOG": os.path.join(work, "ev"), "RK_TIMEOUT_MS": "120000",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    if a.torch:
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env.update({"PYTHONPATH": os.path.join(src, "python"),
                    "REKINDLE_LIB": os.path.join(os.path.abspath(a.build), "lib", "librekindle.so.1")})
        prog = [os.environ.get("RK_TEST_PYTHON") or "/usr/bin/python3", os.path.join(src, "examples", "torch_train.py"),
                "--steps", str(steps), "--hidden", str(hidden), "--batch", str(a.batch), "--device", a.device]
        if os.environ.get("RK_TEST_DIGITS"):
            prog += ["--data", os.environ["RK_TEST_DIGITS"]]
    else:
        prog = [os.path.join(a.build, "bin", "rk-train"), "--steps", str(steps), "--hidden", str(hidden),
                "--layers", str(layers), "--batch", str(a.batch), "--seed", "1", "--device", a.device] + (
                    ["--mem"] if mem else [])
    cmd = [os.path.join(a.build, "bin", "rekindle"), "run", "-n", str(a.ranks), "--"] + prog
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines, at = [], []  # rank 0's lines, and when each "step" line came (flushed a step)
    for line in p.stdout:
        lines.append(line)
        if line.startswith("step "):
            at.append(time.monotonic())
    p.wait()
    out = "".join(lines)
    wall = time.monotonic() - t0
    if a.device != "cpu":  # the time a step from the step lines after the first third
        skip = len(at) // 3
        wall = (at[-1] - at[skip]) / (len(at) - 1 - skip) if len(at) - 1 - skip > 0 else float("nan")
    waits = []
    for f in glob.glob(os.path.join(work, "ev.*")):
        for e in map(json.loads, open(f)):
            if e["event"] == "snapshots":
                waits.append(e["wait_ms"] / max(e["taken"], 1))
    subprocess.run(["rm", "-rf", work])
    if p.returncode != 0:
        sys.exit("snapshot: %s exited %d" % (" ".join(cmd), p.returncode))
    if mem:
        hwm = [int(x) for x in re.findall(r"hwm=(\d+)", out)]
        params = [int(x) for x in re.findall(r"params=(\d+)", out)]
        return max(hwm), params[0] // 4
    return wall, max(waits, default=0.0)


def per_step(a, hidden, layers, every):
    """(seconds a step, ms waited for the copy a step) from a run of N steps and one of 2N;
    on a GPU, where the start-up (CUDA context, pinning) varies by more than N steps take,
    from the step lines of one run of 3N steps: rank 0 prints and flushes one a step, and
    the last 2N of them, timed as they come, give the time a step."""
    if a.device != "cpu":
        return run(a, hidden, layers, every, 3 * a.steps)
    t1, _ = run(a, hidden, layers, every, a.steps)
    t2, w = run(a, hidden, layers, every, 2 * a.steps)
    return (t2 - t1) / a.steps, w


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build")
    p.add_argument("--sizes", default="64,512", help="MiB of state per rank (default 64,512)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="N: runs of N and 2N steps (default 10)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--torch", type=int, metavar="H", help="examples/torch_train.py --hidden H instead of rk-train")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the state lives (default cpu)")
    a = p.parse_args()
    runs = "runs of %d and %d steps" % (a.steps, 2 * a.steps) if a.device == "cpu" else \
        "runs of %d steps, the last %d step lines timed" % (3 * a.steps, 2 * a.steps)
    print("snapshot: %d ranks, batch %d, %s, %d pairs; RK_CKPT_EVERY=0 (no disk); --device %s" % (
        a.ranks, a.batch, runs, a.pairs, a.device), flush=True)
    if a.torch:
        off, on, wait = [], [], []
        for _ in range(a.pairs):
            off.append(per_step(a, a.torch, 0, 0)[0])
            t, w = per_step(a, a.torch, 0, 1)
            on.append(t)
            wait.append(w)
        t0, t1 = statistics.median(off), statistics.median(on)
        state = (64 * a.torch + a.torch * a.torch + 10 * a.torch + 2 * a.torch + 10) * 12 / 2 ** 20
        print("snapshot: torch_train.py --hidden %d (%.1f MiB of parameters and Adam state a rank): %.1f ms a step "
              "without, %.1f ms with a snapshot every step: x%.3f (%+.1f%%); training waited %.2f ms a step for the "
              "copy" % (a.torch, state, t0 * 1e3, t1 * 1e3, t1 / t0, (t1 / t0 - 1) * 100, statistics.median(wait)),
              flush=True)
        return
    for mib in (int(x) for x in a.sizes.split(",")):
        hidden, layers = shape_for(mib)
        off, on, wait = [], [], []
        for _ in range(a.pairs):
            off.append(per_step(a, hidden, layers, 0)[0])
            t, w = per_step(a, hidden, layers, 1)
            on.append(t)
            wait.append(w)
        t0, t1 = statistics.median(off), statistics.median(on)
        print("snapshot: %4d MiB/rank (--hidden %d --layers %d): %.1f ms a step without, %.1f ms with a snapshot "
              "every step: x%.3f (%+.1f%%); training waited %.2f ms a step for the copy (slowest rank, median)" % (
                  mib, hidden, layers, t0 * 1e3, t1 * 1e3, t1 / t0, (t1 / t0 - 1) * 100, statistics.median(wait)),
              flush=True)
    if a.device != "cpu":
        return
    hidden, layers = shape_for(int(a.sizes.split(",")[0]))
    for e in (0, 1):
        base = run(a, 1, 2, e, 2, mem=True)[0]
        hwm, params = run(a, hidden, layers, e, 2, mem=True)
        print("snapshot: memory, RK_SNAPSHOT_EVERY=%d: %.1f bytes a parameter on a rank (peak RSS over the runtime's, "
              "%d parameters; the parameters, gradients and Adam's m and v are 16)" % (e, (hwm - base) / params, params),
              flush=True)


if __name__ == "__main__":
    main()
