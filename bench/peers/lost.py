"""bench/peers/lost.py - a lost worker, three ways, on the same job: examples/torch_train.py's
digits MLP (--hidden H wide), 4 workers, global batch 60, Adam, STEPS steps; the worker of
rank (replica group) 1 SIGKILLed once rank 0 has printed step KILL.

  rekindle   `rekindle run -n 4 -- python examples/torch_train.py`: the survivors roll
             back from the in-memory snapshot and go on as 3 (no restart).
  rekindle-backend
             another job: PyTorch's DDP tutorial program on the torch.distributed backend
             "rekindle" (bench/peers/multigpu_torchrun_backend.py: an unchanged DDP, no
             comm hook), 4 workers, EPOCHS epochs of 16 batches, a snapshot at every epoch
             and a checkpoint every EVERY_EPOCHS, the worker of rank 1 SIGKILLed once rank
             0 printed epoch KILL_EPOCH; its "steps" are the tutorial's epochs.
  torchft    bench/peers/tft_train.py (TorchFT's train_ddp.py loop): a Lighthouse, 4
             replica groups each under `torchrun --max-restarts 1`; the survivors go on,
             torchrun starts a replacement that heals from a peer.
  torchrun   bench/peers/dcp_train.py: `torchrun --nproc-per-node 4 --max-restarts 1`,
             DDP over Gloo, DCP async_save every EVERY steps; the whole job restarts and
             loads the newest checkpoint.

For each: the time from the kill to the first step trained after it (its line seen by
this script), the steps lost (finished before the kill, trained again after it), and
whether the final state equals a fault-free replay where the peer's semantics allow one.
Rekindle's disk checkpoints use the same cadence as DCP's (RK_CKPT_EVERY=EVERY).

    lost.py BUILD WORK [--steps N] [--kill K] [--every E] [--hidden H] [--only M,...]
                       [--epochs N] [--kill-epoch K] [--every-epochs E]

Run with the peers' python (bench/peers/setup); prints one "RESULT ..." line per method,
and leaves each job's output, its lines timed as seen, in WORK/<job>-<pid>.out.
"""
import argparse
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

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
PY = sys.executable
BIN = os.path.dirname(PY)
DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

a = argparse.ArgumentParser()
a.add_argument("build")
a.add_argument("work")
a.add_argument("--steps", type=int, default=300)
a.add_argument("--kill", type=int, default=170)
a.add_argument("--every", type=int, default=50)
a.add_argument("--hidden", type=int, default=1024)
a.add_argument("--only", default="rekindle,rekindle-backend,torchft,torchrun")
a.add_argument("--epochs", type=int, default=40)
a.add_argument("--kill-epoch", type=int, default=20)
a.add_argument("--every-epochs", type=int, default=5)
args = a.parse_args()
BUILD = os.path.abspath(args.build)
STEP = re.compile(r"^step (\d+) ")


class Job:
    """A launched job; each output line kept with the time this script saw it."""

    def __init__(self, cmd, env, name):
        self.name = name
        # every process of the job inherits the mark, also those torchrun puts in sessions
        # of their own: how a job past its bound is ended whole (procs())
        self.mark = "%s-%d-%d" % (name, os.getpid(), time.monotonic_ns())
        self.p = subprocess.Popen(cmd, env=dict(env, PEERS_JOB=self.mark), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def finish(self, timeout=600):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in procs("", "PEERS_JOB", self.mark):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        self.reader.join(10)
        # Each job's output, with the times this script saw its lines, for a reader.
        with open(os.path.join(args.work, "%s-%d.out" % (self.name, self.p.pid)), "w") as f:
            f.writelines("%.3f %s\n" % (t, l) for t, l in self.lines)
        return self.p.returncode

    def text(self):
        return "\n".join(l for _, l in self.lines)


def procs(pattern, env_key=None, env_val=None):
    """Pids whose command line matches pattern (and whose environment has env_key=env_val)."""
    rx, out = re.compile(pattern), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if not rx.search(cmd):
                continue
            if env_key:
                with open("/proc/%s/environ" % d, "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
                if env.get(env_key.encode()) != env_val.encode():
                    continue
            out.append(int(d))
        except (OSError, ValueError):
            continue
    return out


def kill_when(jobs, printed, find, deadline=300):
    """SIGKILL the pid find() names once printed() is true; the time of the kill."""
    end = time.time() + deadline
    while time.time() < end and all(j.p.poll() is None for j in jobs):
        if printed():
            pids = find()
            if pids:
                t = time.time()
                os.kill(pids[0], signal.SIGKILL)
                return t
        time.sleep(0.01)
    return None


def step_lines(job, pred=lambda l: True):
    return [(t, int(STEP.match(l).group(1)), l) for t, l in list(job.lines) if STEP.match(l) and pred(l)]


def rk_env(ckpt, events=None, every=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RK_")}
    env.update({"RK_CKPT_DIR": ckpt, "RK_CKPT_EVERY": str(every or args.every), "RK_TIMEOUT_MS": "5000",
                "REKINDLE_LIB": os.path.join(BUILD, "lib", "librekindle.so.1"),
                "PYTHONPATH": os.path.join(SRC, "python")})
    if events:
        env["RK_EVENT_LOG"] = events
    return env


def rk_job(n, steps, ckpt, events=None, every=None):
    cmd = [os.path.join(BUILD, "bin", "rekindle"), "run", "-n", str(n), "--", PY,
           os.path.join(SRC, "examples", "torch_train.py"), "--steps", str(steps), "--hidden", str(args.hidden),
           "--data", DIGITS]
    return Job(cmd, rk_env(ckpt, events, every), "rekindle")


def final_hashes(text):
    # 16 digits: mpirun may run the next rank's "final ..." into a line (its "f" is hex)
    return re.findall(r"final step=\d+ \S+ hash=([0-9a-f]{16})", text)


def per_step_ms(lines):
    """The median time between successive step lines before the kill."""
    ts = [t for t, _, _ in lines]
    d = sorted(b - a for a, b in zip(ts, ts[1:]))
    return 1e3 * d[len(d) // 2] if d else float("nan")


def rekindle():
    work = os.path.join(args.work, "rekindle")
    ckpt, events = os.path.join(work, "job"), os.path.join(work, "events")
    os.makedirs(ckpt)
    job = rk_job(4, args.steps, ckpt, events)
    printed = lambda: any(s >= args.kill for _, s, _ in step_lines(job))
    # This job's worker itself (its whole command line, not rekindle run's wrapper around
    # it): other jobs may run torch_train.py too.
    find = lambda: procs("^" + re.escape(" ".join(job.p.args[job.p.args.index("--") + 1:])), "OMPI_COMM_WORLD_RANK", "1")
    t_kill = kill_when([job], printed, find)
    rc = job.finish()
    before = [x for x in step_lines(job) if t_kill and x[0] < t_kill]
    after = [x for x in step_lines(job, lambda l: l.endswith("world 3")) if t_kill and x[0] > t_kill]
    resumed = resumed_events(events)
    if rc != 0 or not t_kill or not after or not resumed:
        return "RESULT rekindle FAILED exit=%d killed=%s\n%s" % (rc, bool(t_kill), job.text()[-3000:])
    r = resumed[-1]
    last = max(s for _, s, _ in before)
    return ("RESULT rekindle step_ms=%.1f kill_to_step_s=%.3f steps_lost=%d resumed_at=%d from=%s "
            "final_equals_replay=%s" % (per_step_ms(before), after[0][0] - t_kill, last + 1 - r["step"], r["step"],
                                        r["from"], equals_replay(work, rk_job, args.steps, job, r["step"])))


def resumed_events(events):
    """The `resumed` events of a job's event logs (RK_EVENT_LOG=events)."""
    resumed = []
    for path in glob.glob(events + ".*"):
        with open(path) as f:
            resumed += [e for e in map(json.loads, f) if e.get("event") == "resumed"]
    return resumed


def equals_replay(work, launch, steps, job, step):
    """"yes" if the job's one final hash equals a fault-free replay's: 4 workers to `step`
    (a checkpoint of that step: the survivors resumed from a snapshot in memory), then 3
    from that checkpoint; launch(n, steps, ckpt, every=None) starts a job."""
    got = set(final_hashes(job.text()))
    replay = os.path.join(work, "replay")
    os.makedirs(replay)
    if step > 0:
        launch(4, step, replay, every=step).finish()
    rj = launch(3, steps, replay)
    rj.finish()
    return "yes" if len(got) == 1 and got == set(final_hashes(rj.text())) else "NO"


TUTORIAL = os.path.join(HERE, "multigpu_torchrun_backend.py")
EPOCH = re.compile(r"^\[GPU0\] Epoch (\d+) \| Batchsize: \d+ \| Steps: (\d+)")


def tutorial_job(n, epochs, ckpt, events=None, every=None):
    cmd = [os.path.join(BUILD, "bin", "rekindle"), "run", "-n", str(n), "--", PY, TUTORIAL, str(epochs),
           str(every or args.every_epochs), "--snapshot", ckpt]
    return Job(cmd, rk_env(ckpt, events, every or args.every_epochs), "rekindle-backend")


def rekindle_backend():
    """The DDP tutorial on init_process_group("rekindle"): kill -> the first epoch line of
    the 3 survivors, epochs lost, the final hash against a replay (4 workers to the epoch
    resumed at, then 3 from its checkpoint)."""
    work = os.path.join(args.work, "rekindle-backend")
    ckpt, events = os.path.join(work, "job"), os.path.join(work, "events")
    os.makedirs(ckpt)
    job = tutorial_job(4, args.epochs, ckpt, events)
    epochs = lambda: [(t, int(m.group(1)), int(m.group(2))) for t, l in list(job.lines) for m in [EPOCH.match(l)] if m]
    printed = lambda: any(e >= args.kill_epoch for _, e, _ in epochs())
    find = lambda: procs("^" + re.escape(" ".join(job.p.args[job.p.args.index("--") + 1:])), "OMPI_COMM_WORLD_RANK", "1")
    t_kill = kill_when([job], printed, find)
    rc = job.finish()
    four = [x for x in epochs() if x[2] == epochs()[0][2]]
    before = [x for x in four if t_kill and x[0] < t_kill]
    after = [x for x in epochs() if t_kill and x[0] > t_kill and x[2] != four[0][2]]
    resumed = resumed_events(events)
    if rc != 0 or not t_kill or not after or not resumed:
        return "RESULT rekindle-backend FAILED exit=%d killed=%s\n%s" % (rc, bool(t_kill), job.text()[-3000:])
    r = resumed[-1]
    # an epoch is finished when the next one starts; the one under way at the kill is not
    last = max(e for _, e, _ in before) - 1
    return ("RESULT rekindle-backend epoch_ms=%.1f kill_to_epoch_s=%.3f epochs_lost=%d resumed_at=%d from=%s "
            "final_equals_replay=%s" % (per_step_ms(before), after[0][0] - t_kill, max(0, last + 1 - r["step"]),
                                        r["step"], r["from"], equals_replay(work, tutorial_job, args.epochs, job,
                                                                            r["step"])))


def torchrun_cmd(script, nproc, extra, port=None):
    rdzv = ["--standalone"] if port is None else ["--master-port", str(port)]
    return [os.path.join(BIN, "torchrun"), "--nnodes", "1", "--nproc-per-node", str(nproc), "--max-restarts", "1"] + \
        rdzv + [os.path.join(HERE, script)] + [str(x) for x in extra]


def peer_env():
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RK_JOB_SECRET", None)
    return env


def torchrun_dcp():
    work = os.path.join(args.work, "torchrun")
    os.makedirs(work)
    job = Job(torchrun_cmd("dcp_train.py", 4, [os.path.join(work, "job"), args.steps, args.every, args.hidden]),
              peer_env(), "torchrun")
    printed = lambda: any(s >= args.kill for _, s, _ in step_lines(job))
    find = lambda: procs(r"^\S*python\S* -u %s %s " % (re.escape(os.path.join(HERE, "dcp_train.py")),
                                                      re.escape(os.path.join(work, "job"))), "RANK", "1")
    t_kill = kill_when([job], printed, find)
    rc = job.finish()
    lines = step_lines(job)
    before = [x for x in lines if t_kill and x[0] < t_kill]
    restored = [(t, int(l.split()[2])) for t, l in job.lines if l.startswith("restored step")]
    after = [x for x in lines if t_kill and x[0] > t_kill]
    if rc != 0 or not t_kill or not after or not restored:
        return "RESULT torchrun FAILED exit=%s killed=%s\n%s" % (rc, bool(t_kill), job.text()[-3000:])
    last = max(s for _, s, _ in before)
    got = set(final_hashes(job.text()))
    straight = Job(torchrun_cmd("dcp_train.py", 4, [os.path.join(work, "straight"), args.steps, args.every,
                                                    args.hidden]), peer_env(), "straight")
    straight.finish()
    want = set(final_hashes(straight.text()))
    return ("RESULT torchrun step_ms=%.1f kill_to_step_s=%.3f steps_lost=%d resumed_at=%d from=disk "
            "final_equals_replay=%s" % (per_step_ms(before), after[0][0] - t_kill, last + 1 - restored[-1][1],
                                        restored[-1][1], "yes" if len(got) == 1 and got == want else "NO"))


def torchft_run(work, kill):
    port = 29510 + os.getpid() % 1000
    env = peer_env()
    env.update({"TORCHFT_LIGHTHOUSE": "http://localhost:%d" % port, "NUM_REPLICA_GROUPS": "4"})
    house = subprocess.Popen([os.path.join(BIN, "torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms",
                              "100", "--join_timeout_ms", "10000", "--bind", "[::]:%d" % port],
                             stdout=open(os.path.join(work, "lighthouse.log"), "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    jobs = []
    for g in range(4):
        e = dict(env, REPLICA_GROUP_ID=str(g))
        jobs.append(Job(torchrun_cmd("tft_train.py", 1, [args.steps, args.hidden], port=port + 1 + g), e, "g%d" % g))
    t_kill = None
    if kill:
        printed = lambda: any(s >= args.kill and "committed" in l for _, s, l in step_lines(jobs[0]))
        find = lambda: procs(r"^\S*python\S* -u %s" % re.escape(os.path.join(HERE, "tft_train.py")), "REPLICA_GROUP_ID", "1")
        t_kill = kill_when(jobs, printed, find)
    rcs = [j.finish() for j in jobs]
    house.send_signal(signal.SIGTERM)
    try:
        house.wait(10)
    except subprocess.TimeoutExpired:
        house.kill()
    return jobs, rcs, t_kill


def torchft():
    work = os.path.join(args.work, "torchft")
    os.makedirs(work)
    jobs, rcs, t_kill = torchft_run(work, True)
    text = "\n".join(j.text() for j in jobs)
    lines = step_lines(jobs[0])
    before = [x for x in lines if t_kill and x[0] < t_kill]
    after = [x for x in lines if t_kill and x[0] > t_kill]
    done_after = [x for x in after if "committed" in x[2]]
    if any(rcs) or not t_kill or not done_after:
        return "RESULT torchft FAILED exits=%s killed=%s\n%s" % (rcs, bool(t_kill), text[-4000:])
    last = max(s for _, s, l in before if "committed" in l)
    discarded = sum(1 for _, _, l in after if "discarded" in l)
    healed = [(t, l) for t, l in jobs[1].lines if l.startswith("healed") and t > t_kill]
    back = [x for x in step_lines(jobs[1]) if x[0] > t_kill and "committed" in x[2]]
    three = sum(1 for _, _, l in after if "committed" in l and "participants 3" in l)
    got = final_hashes(text)
    # The fault-free run: the same 4 groups, nobody killed.
    fjobs, _, _ = torchft_run(work, False)
    want = final_hashes("\n".join(j.text() for j in fjobs))
    return ("RESULT torchft step_ms=%.1f kill_to_step_s=%.3f steps_lost=%d discarded_steps=%d "
            "steps_on_3=%d replacement_healed_s=%s replacement_first_step_s=%s replicas_agree=%s "
            "final_equals_replay=%s" % (
                per_step_ms([x for x in before if "committed" in x[2]]), done_after[0][0] - t_kill,
                max(0, last + 1 - done_after[0][1]), discarded, three,
                "%.3f" % (healed[0][0] - t_kill) if healed else "never",
                "%.3f" % (back[0][0] - t_kill) if back else "never",
                "yes" if len(set(got)) == 1 and len(got) == 4 else "NO (%d distinct of %d)" % (len(set(got)), len(got)),
                "yes" if set(got) == set(want) and len(set(want)) == 1 else "NO"))


shutil.rmtree(args.work, ignore_errors=True)
os.makedirs(args.work)
print("lost worker: 4 workers, digits MLP hidden %d, %d steps, SIGKILL of rank 1 after step %d, "
      "checkpoints every %d steps; the DDP tutorial: %d epochs, SIGKILL after epoch %d, checkpoints every %d; "
      "torch %s" % (args.hidden, args.steps, args.kill, args.every, args.epochs, args.kill_epoch, args.every_epochs,
                    __import__("torch").__version__), flush=True)
for m in args.only.split(","):
    print({"rekindle": rekindle, "rekindle-backend": rekindle_backend, "torchft": torchft,
           "torchrun": torchrun_dcp}[m](), flush=True)
