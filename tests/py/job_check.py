"""tests/py/job_check.py - examples/torch_train.py as a real job under `rekindle run`,
judged as the C trainer is: run by tests/test_python.c.

    job_check.py BUILD WORK kill [--ddp | --zero]
        4 workers, one SIGKILLed once a checkpoint is committed. The job must finish on
        the 3 survivors with one final hash, which must equal a fault-free replay: 4 workers
        from scratch to the step the survivors resumed at (its checkpoint), then 3 workers
        from that checkpoint to the end. Where the job committed that step itself, its
        checkpoint must equal the replay's bitwise. --zero: Adam's moments sharded, so the
        survivors take new slices (rk.shard_rows, rk.rebind) and the final hash gathers them.
    job_check.py BUILD WORK last --zero
        The same judgement, but the member is lost in the job's last collective: rank 1
        SIGKILLs itself as the final hash (a gather of the sharded moments) starts
        (tests/py/last_call.py). The survivors must go back to their loop and end normally.
    job_check.py BUILD WORK spare --zero
        The same judgement with 3 workers and a spare (rekindle run --spares 1): one
        worker SIGKILLed, the spare brought in takes the lost slice of the sharded moments
        (after resume(), rk.shard_rows and rk.rebind); the 3 end with the hash of 3 workers
        to that step and 3 from its checkpoint.
    job_check.py BUILD WORK docs with|call
        The same judgement of tests/py/docs_train.py, a program written from docs/PYTHON.md
        alone (the `with rekindle.init()` form or init ... finalize()), with a checkpoint
        at every step (RK_CKPT_EVERY=1): one of 4 workers SIGKILLed once rank 0 printed
        step 65; the job must exit 0, every survivor print its final line. The two forms
        train alike: in one test run (RK_TEST_TMP) the second takes the first's replay.
    job_check.py BUILD WORK backend
        The same judgement of tests/py/backend_train.py: an unchanged DDP on
        init_process_group("rekindle"), written from docs/PYTHON.md alone.
    job_check.py BUILD WORK horovod
        The same judgement of examples/horovod_style.py (Elastic Horovod's API,
        rekindle.elastic), run elastic: `rekindle run --host-discovery-script` listing
        this host with 3 slots. One worker is SIGKILLed once a checkpoint is committed and
        its slot taken off the list (the scheduler lost it), then listed again 0.5 s later
        (it came back): the 2 survivors go on in place from memory, and the launcher grows
        the job back to 3 in place (a worker started on the slot joins them, from their
        memory; by a relaunch at a later checkpoint where the launcher says so). The 3 final
        hashes (the model, SGD's momentum and the state's epoch, batch and step) must equal
        a replay of the job's history world by world: 3 workers to the step the survivors
        resumed at, 2 from there to the step the growth resumed at (a relaunch's checkpoint
        must equal the job's own bitwise), 3 from there to the end.
    job_check.py BUILD WORK elastic
        tests/py/elastic_check.py (rekindle.elastic's TorchState and run(): rollback of
        the scalars, reset callbacks, sync) on 3 workers, one of which SIGKILLs itself:
        the job must end normally with both survivors' "ok".
    job_check.py BUILD WORK first_sync
        tests/py/elastic_first_sync.py (written from docs/PYTHON.md alone) on 3 workers to
        epoch 10 (checkpoints every 5 commits), then launched again to epoch 20 with one
        worker SIGKILLed just before the run() function's first call: the two others find
        the loss in its first sync(), roll back to the checkpoint of epoch 10 and must go on
        (exit 0), each once reset (size 2), from epoch 10 to 20, with the same state.
    job_check.py BUILD WORK sampler
        tests/py/elastic_sampler.py (written from docs/PYTHON.md alone) on 3 workers, 3
        epochs, launch rank 2 SIGKILLed at its 27th commit (inside the second epoch): both
        survivors must end (exit 0, size 2, reset once) with the sum of every sample's
        value once an epoch (3 x 7260): the ElasticSampler's progress rolled back with the
        state and the rest of the epoch shared out over 2.
    job_check.py BUILD WORK relaunch
        2 workers to step 60, then the job launched again to step 90: it resumes from disk
        (step 60), ends with the hash of an uninterrupted 90-step run, and rekindle.load of
        its last checkpoint equals the model's final state_dict() bitwise.

    job_check.py BUILD WORK venv example|backend|dcp
        The wheel built from BUILD, installed into a fresh venv (tests/py/wheel_venv.py);
        every program run by the venv's python through tests/py/venv_origin.py (which
        checks that its rekindle and librekindle are the venv's), every job launched by
        the venv's `rekindle run`. example: examples/multigpu_torchrun_rekindle.py 30 10
        on 4 workers, rank 1 SIGKILLing itself in its rk_allreduce number 136; the 3
        survivors' checkpoint 30 must equal a replay's bitwise. backend: mode backend
        above. dcp: tests/py/dcp_train.py (DDP over Gloo, DCP through rekindle.dcp) under
        `rekindle run --max-restarts 1`, rank 1 SIGKILLing itself after its 25th
        optimizer step; launched again from checkpoint 20, its final hash and checkpoints
        20 and 40 must equal a replay's (to step 20, then launched again from it).

Exit 0 when every check passed; otherwise a message saying which and why (exit 1).
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import torch

import rekindle
import wheel_venv
from procs import held_env, list_slots, mpi_rank, wait_join_decided, workers

BUILD, WORK, MODE, FLAGS = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VENV = None
if MODE == "venv":  # the programs from a fresh venv: set up at the start (fresh_venv())
    MODE, FLAGS, VENV = FLAGS[0], FLAGS[1:], os.path.join(WORK, "wheel", "venv")
# How a worker's program starts, and the launcher: the source tree's package and the build
# under test's command, or in venv mode the venv's python through tests/py/venv_origin.py
# (which checks where its rekindle came from) and the venv's `rekindle`.
PY = [sys.executable] if VENV is None else [
    os.path.join(VENV, "bin", "python"), os.path.join(SRC, "tests", "py", "venv_origin.py"), VENV]
RKCMD = os.path.join(BUILD if VENV is None else VENV, "bin", "rekindle")
# Anywhere in a line, as the survivors' lines below: mpirun may run another rank's output
# into the line that holds it.
FINAL = re.compile(r"(?<![\w=])final step=(\d+) world=(\d+) hash=([0-9a-f]{16})(?![0-9a-f])")
if MODE in ("docs", "backend"):
    TRAIN, EVERY = os.path.join(SRC, "tests", "py", MODE + "_train.py"), 1
    KILL_AT = 65  # docs: rank 1 kills itself in this allreduce; backend: rank 0 printed this step

    def program(steps):
        return PY + [TRAIN, str(steps)] + FLAGS
else:
    # horovod: the Elastic Horovod-style example (rekindle.elastic), same arguments
    TRAIN = os.path.join(SRC, "examples", "horovod_style.py" if MODE == "horovod" else "torch_train.py")
    EVERY, KILL_AT = 30, None

    def program(steps):  # horovod: epochs enough for any --steps here (19-28 batches an epoch)
        return PY + [TRAIN, "--steps", str(steps), "--seed", "5"] + FLAGS + (
            ["--epochs", "400"] if MODE == "horovod" else [])


# docs: rank 1 SIGKILLs itself in its allreduce number KILL_AT (the library's fault point,
# RK_FAULT=allreduce@N=crash, kept on that rank alone by chaos/worker.sh; one allreduce a
# step): a kill from outside once rank 0's line for that step was seen came, under load,
# after the job had finished (the lines reach this script through mpirun, late).
SELF_KILL = MODE in ("last", "docs")


def job_program(steps):
    """The killed job's program; the replays run program()."""
    if MODE == "last":
        return PY + [os.path.join(SRC, "tests", "py", "last_call.py")] + program(steps)[len(PY) + 1:]
    if MODE == "docs":
        return [os.path.join(SRC, "chaos", "worker.sh")] + program(steps)
    return program(steps)


def job_env():
    """What the killed job's environment adds: docs, rank 1's fault point (first launch)."""
    if MODE == "horovod":
        # The two left would end the job's 1200 steps in 2 s, before a newcomer's Python has
        # imported torch on a loaded machine (seen in CI): they are held at their 1000th
        # rk_step_done until the members' join thread says the newcomer is merged (kill()).
        return held_env(HOLD, 1000)
    if MODE != "docs":
        return {}
    return {"RK_FAULT": "allreduce@%d=crash" % KILL_AT, "CHAOS_FAULT_RANK": "1", "CHAOS_FAULT_ATTEMPT": "0"}
NAME = " ".join([MODE] + FLAGS)
GROW_LINE = "rekindle: run: launching again to grow (not a restart)"
GROW_IN_PLACE_LINE = "rekindle: run: grown in place to"
HOLD = os.path.join(WORK, "hold")
SCALE = int(os.environ.get("RK_TEST_TIME_SCALE", "1") or 1)  # tests/run: every bound of the tests scales


def fail(msg, log=""):
    print("job_check %s: FAILED: %s" % (NAME, msg))
    if log:
        whole = os.path.join(WORK, "failed-job.log")
        try:
            with open(whole, "w") as f:
                f.write(log)
        except OSError:
            whole = "not kept"
        print("---- log tail (whole: %s) ----\n%s" % (whole, log[-4000:]))
    sys.exit(1)


def env_for(ckpt, events=None, every=None):
    env = {k: v for k, v in (os.environ if VENV is None else wheel_venv.env()).items() if not k.startswith("RK_")}
    # RK_KEEP: the checkpoint a growth resumed from stays for the comparison with the replay's
    env.update({"RK_CKPT_EVERY": str(every or EVERY), "RK_TIMEOUT_MS": "5000", "RK_KEEP": "1000"})
    if ckpt:  # (none: a program that takes its checkpoint directory as an argument)
        env["RK_CKPT_DIR"] = ckpt
    if VENV is None:
        env["PYTHONPATH"] = os.path.join(SRC, "python")
    else:  # the example prints with print(): its lines as they come, for the kill's trigger
        env["PYTHONUNBUFFERED"] = "1"
    if events:
        env["RK_EVENT_LOG"] = events
    return env


class Job:
    """`rekindle run -n N` of the program (hosts: a discovery script's list instead, for
    at most N workers); its output is collected as it comes."""

    def __init__(self, n, steps, ckpt, events=None, extra=(), prog=program, spares=0, every=None, hosts=None,
                 launch=(), cwd=None, env=None):
        size = ["-n", str(n), "--spares", str(spares)] if hosts is None else [
            "--host-discovery-script", "cat " + hosts, "--discovery-interval", "0.2", "--blacklist-cooldown", "0.5",
            "--max-np", str(n)]
        cmd = [RKCMD, "run"] + size + list(launch) + ["--"] + prog(steps) + list(extra)
        self.p = subprocess.Popen(cmd, env=dict(env_for(ckpt, events, every), **(env or {})), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=cwd)
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.p.stdout), daemon=True)
        self.reader.start()

    def output(self):
        return "".join(self.lines)


def finish(job, timeout=None):
    timeout = timeout or 300 * SCALE
    try:
        job.p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.p.pid, signal.SIGKILL)
        job.p.wait()
        job.reader.join(10)
        fail("the job did not end within %d s" % timeout, job.output())
    job.reader.join(30)
    return job.p.returncode, job.output()


def one_final(out, steps, world, what):
    finals = FINAL.findall(out)
    if len(finals) != world:
        fail("%s: %d final lines, want %d" % (what, len(finals), world), out)
    if {(int(s), int(w)) for s, w, _ in finals} != {(steps, world)} or len({h for _, _, h in finals}) != 1:
        fail("%s: final lines disagree or are not step=%d world=%d: %s" % (what, steps, world, finals), out)
    return finals[0][2]


def run(n, steps, ckpt, what, extra=(), every=None, prog=program, cwd=None, final=True):
    rc, out = finish(Job(n, steps, ckpt, extra=extra, every=every, prog=prog, cwd=cwd))
    if rc != 0:
        fail("%s: exit %d" % (what, rc), out)
    from_venv(out, n, what)
    return one_final(out, steps, n, what) if final else None, out


def from_venv(out, n, what):
    """In venv mode, every worker that ended said its rekindle was the venv's
    (tests/py/venv_origin.py); n: how many ended."""
    if VENV is not None:
        said = re.findall(r"venv_origin: rank (\d+): rekindle from " + re.escape(os.path.realpath(VENV)), out)
        if len(said) != n or "venv_origin: the" in out:
            fail("%s: %d of %d workers say their rekindle was the fresh venv's" % (what, len(said), n), out)


def equal_state(a, b):
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and
        torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)) for k in a)


def kill():
    grow = MODE == "horovod"  # lost, then its slot listed again: grows back
    steps = 1200 if grow else 240 if KILL_AT is None else 120
    ckpt, events = os.path.join(WORK, "job"), os.path.join(WORK, "events")
    os.makedirs(ckpt)
    spares = 1 if MODE == "spare" else 0
    n = 3 if grow else 4 - spares  # the workers in the ring; the world after the loss:
    world = n if spares or grow else n - 1
    hosts = os.path.join(WORK, "hosts") if grow else None
    if grow:
        list_slots(hosts, n)
    job = Job(n, steps, ckpt, events, prog=job_program, spares=spares, hosts=hosts, env=job_env())
    # Once a checkpoint is committed (docs: rank 0 printed step KILL_AT), SIGKILL the
    # worker of launch rank 1, never a spare (last: rank 1 kills itself).
    pattern = "^" + re.escape(" ".join(program(steps)))
    ready = lambda: glob.glob(os.path.join(ckpt, "step-*")) if KILL_AT is None else any(
        l.startswith("step %d " % KILL_AT) for l in list(job.lines))
    # the first checkpoint may take long on a loaded machine: the bound scales as the tests' do
    victim, deadline = "rank 1, itself" if SELF_KILL else None, time.time() + 180 * SCALE
    while victim is None and time.time() < deadline and job.p.poll() is None:
        if ready():
            pids = [p for p in workers(pattern) if mpi_rank(p) == 1]
            if pids:
                victim = pids[0]
                if grow:
                    list_slots(hosts, n - 1)
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.05)
    if grow and victim is not None:
        time.sleep(0.5)
        list_slots(hosts, n)
        wait_join_decided(job.p, job.lines, 120 * SCALE)
    if grow:
        os.unlink(HOLD)
    rc, out = finish(job)
    with open(os.path.join(WORK, "job.log"), "w") as f:  # the whole output, for a look afterwards
        f.write(out)
    if victim is None:
        fail("no worker was killed (none found once %s)" % (
            "a checkpoint was committed" if KILL_AT is None else "step %d was printed" % KILL_AT), out)
    if rc != 0:
        fail("the job ended with exit %d after a worker was killed" % rc, out)
    # A job stopped to grow may have reached its end first: its workers then printed their
    # final lines before the stop ended them, and the launch that grew it prints the job's.
    last = out.rsplit(GROW_LINE, 1)[-1] if grow else out
    got = one_final(last, steps, world, "the job's last launch" if grow else "the job")
    from_venv(out, world, "the job")
    resumed = []
    for path in glob.glob(events + ".*"):
        with open(path) as f:
            resumed += [e for e in map(json.loads, f) if e.get("event") == "resumed"]
    if not resumed:
        fail("no 'resumed' event in %s.*" % events, out)
    resumed.sort(key=lambda e: e["t_ns"])
    if grow:
        return grown_back(out, got, resumed, n, steps, ckpt)
    step, source = resumed[-1]["step"], resumed[-1]["from"]
    if len({(e["step"], e["from"]) for e in resumed if e["epoch"] == resumed[-1]["epoch"]}) != 1:
        fail("the survivors resumed differently: %s" % resumed)
    # The replay: n workers from scratch to `step` (a checkpoint of that step: a memory
    # rollback resumes the newest snapshot, taken at every step), then `world` from there.
    # docs: the two forms (with, call) train alike, and both resume at the step of their
    # own fault point: the second of a test run (RK_TEST_TMP) takes the first's replay.
    shared = MODE == "docs" and VENV is None and os.environ.get("RK_TEST_TMP")
    replay = os.path.join(shared, "docs-replay-%d-%d-%d-%d" % (n, world, step, steps)) if shared else os.path.join(
        WORK, "replay")
    done = os.path.join(replay, "final-hash")
    if shared and os.path.exists(done):
        with open(done) as f:
            want = f.read().strip()
        print("job_check %s: the replay of the same training from step %d: %s" % (NAME, step, replay))
    else:
        shutil.rmtree(replay, ignore_errors=True)
        os.makedirs(replay)
        if step > 0:
            run(n, step, replay, "replay to step %d on %d workers" % (step, n), every=step)
        want, _ = run(world, steps, replay, "replay from step %d on %d workers" % (step, world))
        with open(done, "w") as f:
            f.write(want + "\n")
    mine = os.path.join(ckpt, "step-%012d" % step)
    if step > 0 and os.path.isdir(mine) and not equal_state(rekindle.load(ckpt, step), rekindle.load(replay, step)):
        fail("the job's checkpoint %d differs from the replay's" % step)
    if got != want:
        fail("final hash %s, the replay from step %d (resumed from %s) gives %s" % (got, step, source, want), out)
    print("job_check %s: ok: survivors resumed at step %d from %s, hash %s equals the replay's" % (
        NAME, step, source, got))


def grown_back(out, got, resumed, n, steps, ckpt):
    """The judgement of a job that lost a worker, went on in place, then grew back: in place
    (the default: a worker started on the slot joins, from the others' memory), or by a
    relaunch at a checkpoint where the launcher says it went that way."""
    in_place = GROW_IN_PLACE_LINE in out
    if (not in_place and GROW_LINE not in out) or "relaunching, restart" in out:
        fail("the job did not grow back, in place or by a relaunch at a checkpoint (or was restarted)", out)
    memory = [e for e in resumed if e["from"] == "memory"]
    later = [e for e in resumed if memory and e["t_ns"] > memory[0]["t_ns"] and
             (e["from"] == "memory" and e.get("world") == n if in_place else e["from"] == "disk")]
    if not memory or not later:
        fail("want a resume from memory (the loss), then one %s (the growth): %s" % (
            "from memory on %d" % n if in_place else "from disk", resumed), out)
    a, b = memory[0]["step"], later[-1]["step"]
    replay = os.path.join(WORK, "replay")
    os.makedirs(replay)
    if a > 0:
        run(n, a, replay, "replay to step %d on %d workers" % (a, n), every=a)
    run(n - 1, b, replay, "replay from step %d to %d on %d workers" % (a, b, n - 1), every=b)
    if not in_place and not equal_state(rekindle.load(ckpt, b), rekindle.load(replay, b)):
        fail("the job's checkpoint %d, which the growth resumed from, differs from the replay's" % b)
    want, _ = run(n, steps, replay, "replay from step %d on %d workers" % (b, n))
    if got != want:
        fail("final hash %s; the replay (%d workers to %d, %d to %d, %d to the end) gives %s" % (
            got, n, a, n - 1, b, n, want), out)
    print("job_check %s: ok: %d survivors resumed at step %d from memory, grew back to %d %s %d, "
          "hash %s equals the replay's" % (NAME, n - 1, a, n, "in place at step" if in_place else "at checkpoint",
                                           b, got))


def relaunch():
    ckpt, events = os.path.join(WORK, "job"), os.path.join(WORK, "events")
    straight, _ = run(2, 90, os.path.join(WORK, "straight"), "an uninterrupted run")
    run(2, 60, ckpt, "the first launch")
    saved = os.path.join(WORK, "state.pt")
    rc, out = finish(Job(2, 90, ckpt, events, ["--save-state", saved]))
    if rc != 0:
        fail("the relaunch ended with exit %d" % rc, out)
    got = one_final(out, 90, 2, "the relaunch")
    with open(events + ".0") as f:
        resumed = [e for e in map(json.loads, f) if e.get("event") == "resumed"]
    if [(e["step"], e["from"]) for e in resumed] != [(60, "disk")]:
        fail("the relaunch resumed %s, want step 60 from disk" % resumed, out)
    if got != straight:
        fail("the relaunch's hash %s differs from an uninterrupted run's %s" % (got, straight), out)
    loaded, model = rekindle.load(ckpt, prefix="model"), torch.load(saved)
    if not equal_state(loaded, model):
        fail("rekindle.load(%s, prefix='model') differs from the model's state_dict()" % ckpt)
    print("job_check relaunch: ok: resumed from step 60 on disk, hash %s, load equals state_dict" % got)


def elastic():
    script = [sys.executable, os.path.join(SRC, "tests", "py", "elastic_check.py")]
    rc, out = finish(Job(3, 0, os.path.join(WORK, "job"), prog=lambda steps: script))
    oks = re.findall(r"elastic_check rank (\d+): ok", out)  # unanchored, as in first_sync
    if rc != 0 or sorted(oks) != ["0", "1"]:
        fail("exit %d, 'ok' from launch ranks %s: want 0, from 0 and 1" % (rc, oks), out)
    print("job_check elastic: ok: both survivors' checks passed")


def first_sync():
    script = os.path.join(SRC, "tests", "py", "elastic_first_sync.py")
    ckpt = os.path.join(WORK, "job")
    rc, out = finish(Job(3, 10, ckpt, prog=lambda epochs: [sys.executable, script, str(epochs)], every=5))
    if rc != 0:
        fail("the first launch ended with exit %d" % rc, out)
    rc, out = finish(Job(3, 20, ckpt, prog=lambda epochs: [sys.executable, script, str(epochs), "kill"], every=5))
    # Not anchored to a line's start: mpirun forwards the ranks' output as it reads it, and
    # one rank's line may run into another's before its newline.
    ends = re.findall(r"first_sync rank (\d+): epochs (\d+)\.\.(\d+) resets \[([^\]]*)\] state (\w+) on (\d+) ranks", out)
    want = [(r, "10", "20", "2", "same", "2") for r in ("0", "1")]
    if rc != 0 or sorted(ends) != want:
        fail("exit %d, ends %s: want 0 and %s (a loss in the first sync goes on from the checkpoint)" % (
            rc, ends, want), out)
    print("job_check first_sync: ok: the two survivors of a loss in the first sync went on from epoch 10, reset once")


def sampler():
    script = os.path.join(SRC, "tests", "py", "elastic_sampler.py")
    rc, out = finish(Job(3, 3, os.path.join(WORK, "job"), prog=lambda epochs: [sys.executable, script, str(epochs), "27"],
                         every=5))
    ends = re.findall(r"sampler rank (\d+): total ([\d.]+) epochs (\d+) size (\d+) resets \[([^\]]*)\]", out)
    want = [(r, "21780.0", "3", "2", "2") for r in ("0", "1")]
    if rc != 0 or sorted(ends) != want:
        fail("exit %d, ends %s: want 0 and %s (every sample once an epoch: 3 x 7260)" % (rc, ends, want), out)
    print("job_check sampler: ok: the two survivors took every sample once an epoch (total 21780), reset once")


def resumed_events(events):
    out = []
    for path in glob.glob(events + ".*"):
        with open(path) as f:
            out += [e for e in map(json.loads, f) if e.get("event") == "resumed"]
    return sorted(out, key=lambda e: e["t_ns"])


def example():
    """examples/multigpu_torchrun_rekindle.py (PyTorch's DDP tutorial with the comm hook)
    30 10 on 4 workers, each in WORK/<job>/ (its checkpoints: ./snapshot), rank 1
    SIGKILLing itself in its 137th rk_allreduce (epoch 8 of 16 batches: venv_origin
    --crash-at): the 3 survivors' checkpoint of epoch 30 must equal a replay's bitwise (4
    workers to the epoch they resumed at, 3 from there). Its data set and model come from
    torch's unseeded generator: venv_origin seeds it (--seed 0), the same on every rank and
    in the replay."""
    ex = os.path.join(SRC, "examples", "multigpu_torchrun_rekindle.py")

    def prog(epochs, every=10, crash=()):
        return lambda _: PY + list(crash) + ["--seed", "0", ex, str(epochs), str(every)]
    work, replay, events = os.path.join(WORK, "job"), os.path.join(WORK, "replay"), os.path.join(WORK, "events")
    os.makedirs(work)
    os.makedirs(replay)
    rc, out = finish(Job(4, 30, None, events, prog=prog(30, crash=["--crash-at", "1:allreduce@136"]), cwd=work))
    if rc != 0 or "job completed by 3 of 4 workers; lost: rank 1: killed by signal 9" not in out:
        fail("exit %d: want the job completed by 3 of 4 workers, rank 1 killed by signal 9" % rc, out)
    from_venv(out, 3, "the job")
    resumed = resumed_events(events)
    if not resumed or len({(e["step"], e["from"]) for e in resumed}) != 1:
        fail("want one resume of every survivor, the same: %s" % resumed, out)
    step, source = resumed[-1]["step"], resumed[-1]["from"]
    if step > 0:
        run(4, step, None, "replay to epoch %d on 4 workers" % step, prog=prog(step, step), cwd=replay, final=False)
    run(3, 30, None, "replay from epoch %d on 3 workers" % step, prog=prog(30), cwd=replay, final=False)
    mine, want = rekindle.load(os.path.join(work, "snapshot"), 30), rekindle.load(os.path.join(replay, "snapshot"), 30)
    if not equal_state(mine, want):
        fail("the survivors' checkpoint of epoch 30 differs from the replay's (resumed at %d from %s)" % (step, source))
    print("job_check %s: ok: survivors resumed at epoch %d from %s, checkpoint 30 equals the replay's" % (
        NAME, step, source))


def dcp_relaunch():
    """tests/py/dcp_train.py (DDP over Gloo, DCP through rekindle.dcp) on 4 workers under
    `rekindle run --max-restarts 1`, steps 40, a checkpoint every 10, rank 1 SIGKILLing
    itself after its 25th optimizer step (venv_origin --crash-at; checkpoint 20 is
    committed then): the survivors fail (Gloo), the job is launched again, loads the
    newest checkpoint (20) and must end with the final hash of a replay that was not killed
    (to step 20, then launched again from its checkpoint); checkpoints 20 and 40 equal the
    replay's bitwise."""
    train = os.path.join(SRC, "tests", "py", "dcp_train.py")
    ckpt, replay = os.path.join(WORK, "job"), os.path.join(WORK, "replay")

    def prog(root, crash=()):
        return lambda steps: PY + list(crash) + [train, root, str(steps), "10"]
    rc, out = finish(Job(4, 40, None, prog=prog(ckpt, ["--crash-at", "1:step@25"]), launch=["--max-restarts", "1"]))
    if rc != 0 or not re.search(r"rank 1: killed by signal 9 \(Killed\)[^\n]*relaunching, restart 1 of 1", out):
        fail("exit %d: want rank 1 killed by signal 9, the job launched again once, then exit 0" % rc, out)
    again = out.split("relaunching, restart 1 of 1", 1)[1]
    restored = re.findall(r"restored step (\d+)", again)
    if restored != ["20"]:
        fail("the relaunch restored %s, want step 20 (the newest committed at the kill)" % restored, out)
    got = one_final(again, 40, 4, "the relaunched job")
    from_venv(again, 4, "the relaunched job")
    # The replay: to step 20, then launched again from its checkpoint 20 to the end (not
    # one run to 40: DDP's first pass after its construction buckets the gradients as
    # they are made, later passes as they came, and Gloo's sum of an element depends on
    # where it sits in the bucket: a launch that goes on from step 20 differs in the last
    # bits from one that had run since step 0, kill or no kill).
    run(4, 20, None, "replay to step 20", prog=prog(replay))
    want, again = run(4, 40, None, "replay from step 20", prog=prog(replay))
    if re.findall(r"restored step (\d+)", again) != ["20"]:
        fail("the replay's second launch did not restore step 20", again)
    for step in (20, 40):
        if not equal_state(rekindle.load(ckpt, step), rekindle.load(replay, step)):
            fail("the job's checkpoint %d differs from the replay's" % step)
    if got != want:
        fail("final hash %s after the relaunch from step 20, the replay's %s" % (got, want), out)
    print("job_check %s: ok: launched again from checkpoint 20, checkpoints 20 and 40 and the final hash %s "
          "equal the replay's" % (NAME, got))


def fresh_venv():
    """venv mode: the wheel built from BUILD installed into a new venv (tests/py/wheel_venv.py)."""
    made, _, _ = wheel_venv.make(BUILD, os.path.join(WORK, "wheel"), sys.executable, "job_check")
    assert made == VENV


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
if VENV is not None:
    NAME = "venv " + NAME
    fresh_venv()
{"relaunch": relaunch, "elastic": elastic, "first_sync": first_sync, "sampler": sampler, "example": example,
 "dcp": dcp_relaunch}.get(MODE, kill)()
