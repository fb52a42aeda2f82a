"""chaos/oracles.py - what must hold after every chaos run, checked on the real artifacts.

Each oracle returns (name, status, detail) with status 'ok', 'violation' or 'skipped'
(skipped only when the thing it checks does not exist in this run, e.g. no final hash
after a run that had to stop; the reason is in the detail and in the report).

  ended        finished: the last launch exited 0 and every final line says step=N with
               one hash and one world; or, where the run must stop (min_world), it
               stopped with that error, within the run's time bound (no hang)
  in_place     the kinds that must be survived without a relaunch were: no relaunch,
               the final world is the start world less the lost workers (a victim no
               survivor declared dead was killed after the job's last collective and
               still counts in the final world, though it prints no final line); a SIGSTOPped
               worker did not finish and committed nothing after it was continued: it
               fenced itself (event 'fenced'), or, when the others were already gone
               and nobody could tell it, it refused to go on as a minority
               (RK_E_NO_MAJORITY on its stderr); a partitioned host's workers (the
               minority) did not finish (no 'exit 0' record) and committed nothing
               after the partition began; an elastic kind (host_return, host_add)
               was relaunched only to grow and ended at the full world, or had no
               checkpoint after the host was back to grow at (skipped, said); a growth
               onto a spare (grow_spare, kill_joining) was made in place (the launcher said
               it grows in place, no relaunch) and ended at W+1, or at W when the spare was
               killed while it joined; a host whose trainers were lost and that is listed
               again (host_relist, kill_newcomer) was grown back in place to W with no
               relaunch at all, or, its first newcomer killed while joining, ended with no
               relaunch between the survivors' world and W
  verify       `rekindle verify` passes every committed checkpoint (--all), and fails
               each one the harness damaged
  h5           every committed checkpoint opens with h5py: root attributes step (equal
               to its label), world_size, format_version; every tensor readable
  fresh_resume no resume older than the newest checkpoint committed before the fault
  replay       the final hash equals a fault-free replay from the last resume step on the
               final world size (that checkpoint copied alone into a fresh directory);
               an elastic kind's whole history replayed from scratch, world by world
  no_leftover  no process of the run (launcher, mpirun, orted, wrapper, trainer) alive
               after it ended
  no_temp      no '.'-prefixed entry in the checkpoint directory after a clean end
  no_false_dead no worker declared dead that the harness did not kill, stop or crash
               (declarations by a worker while or after it was stopped are its stale
               view of the others, not false deaths; a worker wedged inside MPI by a
               peer's death, which leaves with RK_EXIT_WEDGED, counts as lost and is named;
               deaths while the launcher stops the job to grow it are that stop)
  events       every event-log line is one JSON object with t_ns, rank and event
"""
import os
import re
import shutil
import subprocess

import faults
from job import FINAL_RE, MPI_ENV

MIN_WORLD_TEXT = "fewer workers survive than min_world"


def _ok(name, detail=""):
    return (name, "ok", detail)


def _bad(name, detail):
    return (name, "violation", detail)


def _skip(name, detail):
    return (name, "skipped", detail)


def committed_steps(ckpt):
    out = []
    for d in sorted(os.listdir(ckpt)):
        m = re.fullmatch(r"step-(\d{12})", d)
        if m:
            out.append(int(m.group(1)))
    return out


def last_finals(job):
    """The final lines of the last attempt of the last harness launch. An earlier attempt's
    workers can print theirs and then be killed while shutting down (a job_kill after the
    job's last checkpoint): `rekindle run` relaunches, and the relaunch resumes from that
    checkpoint and prints them again."""
    return [f for f in job.finals if f[0] == job.phase and f[4] == job.attempt]


def check_ended(job, plan, steps, timed_out):
    if timed_out:
        return _bad("ended", "still running after %ds: a hang (every process of the run was killed)" % timed_out)
    rc = job.rcs[-1] if job.rcs else None
    finals = last_finals(job)
    if plan["expect"] == "stop":
        # A victim killed after the job's last collective (a late fault on a short job) is
        # never needed again: the others finish at the full world, never below min_world.
        late, min_world = killed_after_end(job, plan), int(plan["env"].get("RK_MIN_WORLD", "0"))
        if (rc == 0 and late and lost_ranks(job, plan) <= late and finals
                and all(f[1] == steps and f[2] >= min_world for f in finals)):
            return _ok("ended", "rank(s) %s lost after the last collective: finished at world %d, not below "
                       "min_world %d" % (sorted(late), finals[0][2], min_world))
        if rc == 0 or any(f[1] == steps for f in finals):
            return _bad("ended", "continued below min_world (exit %s, %d final lines)" % (rc, len(finals)))
        if MIN_WORLD_TEXT not in job.stderr_text():
            return _bad("ended", "stopped (exit %s) without the min_world error on stderr" % rc)
        return _ok("ended", "stopped with the min_world error, exit %s" % rc)
    if rc != 0:
        tail = job.stderr_text().strip().splitlines()[-3:]
        return _bad("ended", "rekindle run exited %s: %s" % (rc, " | ".join(tail)))
    if not finals:
        return _bad("ended", "exit 0 but no 'final' line")
    if any(f[1] != steps for f in finals):
        return _bad("ended", "final step %s, want %d" % (sorted({f[1] for f in finals}), steps))
    if len({f[3] for f in finals}) != 1 or len({f[2] for f in finals}) != 1:
        return _bad("ended", "survivors disagree: %s" % sorted({(f[2], f[3]) for f in finals}))
    late = killed_after_end(job, plan)
    if not (finals[0][2] - len(late) <= len(finals) <= finals[0][2]):
        return _bad("ended", "%d final lines for a final world of %d" % (len(finals), finals[0][2]))
    return _ok("ended", "step=%d world=%d hash=%s" % (steps, finals[0][2], finals[0][3]))


def killed_after_end(job, plan):
    """Victims killed, crashed by an I/O fault, or stopped after the job's last collective
    (a late fault on a short job): they belong to the final world, and a killed or crashed
    one prints no final line. Either no survivor ever declared them dead, or none
    recovered after it did: survivors that finished without a recovery after the loss did
    not need the victim for any collective left."""
    dead = {}
    for e in job.events_named("peer_dead"):
        dead[e.get("peer")] = min(dead.get(e.get("peer"), e["t_ns"]), e["t_ns"])
    resumed = [e["t_ns"] for e in job.events_named("resumed")]
    victims = set()
    for f in plan["faults"]:
        if f.get("fired") and f["kind"] in ("kill", "host_loss", "stop"):
            victims |= set(f["victims"])
        victims |= io_crashed(job, f)
    return {v for v in victims if v not in dead or not any(t > dead[v] for t in resumed)}


def io_crashed(job, f):
    """The rank an I/O fault '=crash' took out: {rank} when it fired and the rank died of
    it, else empty (a drawn index the rank never reached does nothing)."""
    if f.get("fired") and f["kind"] == "io" and f["spec"].endswith("=crash") and crashed(job, f["rank"]):
        return {f["rank"]}
    return set()


def wedged(job):
    """Workers that left with RK_EXIT_WEDGED: a call into MPI that never returned after a
    peer died mid-send (docs/RING.md, "Transport"), a casualty of the run's kills."""
    return {e["_file_rank"] for e in job.events if e["event"] == "wedged"}


def lost_ranks(job, plan):
    """The ranks the run's faults took out of the job (killed, stopped, cut off, crashed,
    or wedged inside MPI by a peer's death)."""
    lost = set(wedged(job))
    for f in plan["faults"]:
        if f.get("fired") and f["kind"] in ("kill", "stop", "host_loss", "partition"):
            lost |= set(f["victims"])
        lost |= io_crashed(job, f)
    return lost


def nothing_to_roll_back(job, plan, workers):
    """Whether the survivors of the first launch found neither a partnered snapshot in
    memory nor a committed checkpoint on disk (the recovery's own words in the log): the
    loss fell inside the newest snapshot's partner copy, or (sharded state) one fault
    took a slice's owner r and its partner, r+1 on the ring (docs/SHARDING.md), together,
    before any checkpoint was committed."""
    err = job.stderr_text()
    if "rollback: no snapshot in memory or on disk" not in err:
        return False
    if re.search(r"no partner copy of the snapshot of step \d+", err):
        return True
    return plan.get("zero", False) and any(
        f.get("fired") and f["kind"] == "kill" and f.get("committed_before") == 0 and
        any((v + 1) % workers in f["victims"] for v in f["victims"]) for f in plan["faults"])


GROW_TEXT = "launching again to grow (not a restart)"
GROW_STOP = re.compile(r"rekindle: run: checkpoint (\d+) committed: stopping the job to launch it again")


def growths(job):
    """How many times the launcher relaunched the job to grow it (not restarts)."""
    return job.stderr_text().count(GROW_TEXT)


def growth_stops(job):
    """(from, to) CLOCK_REALTIME ns of each stop of the job to grow it: from the commit
    of the checkpoint the launcher waited for to the first resume from disk after it."""
    out = []
    for m in GROW_STOP.finditer(job.stderr_text()):
        t0 = min((e["t_ns"] for e in job.events_named("ckpt_committed") if e["step"] == int(m.group(1))), default=None)
        if t0 is None:
            continue
        t1 = min((e["t_ns"] for e in job.events_named("resumed", t0) if e.get("from") == "disk"), default=float("inf"))
        out.append((t0, t1))
    return out


def check_grown(job, plan, cfg):
    """An elastic kind: the loss (host_return) was survived in place, every relaunch was a
    growth, and the job ended at its full size (the workers of every host)."""
    workers, grown, f = cfg["workers"], growths(job), plan["faults"][0]
    restarts = job.relaunches() - grown
    if job.phase != 0 or restarts:
        if nothing_to_roll_back(job, plan, workers):
            return _skip("in_place", "a slice lost in memory before any commit: rightly relaunched")
        return _bad("in_place", "the job was restarted %d time(s) besides %d growth(s)" % (restarts, grown))
    finals = last_finals(job)
    if finals and finals[0][2] == workers:
        mem = [e["step"] for e in job.events_named("resumed") if e.get("from") == "memory"]
        return _ok("in_place", "%s; grew %s %d by %d relaunch(es) at a checkpoint" % (
            "the loss survived in place (resumed step %d from memory)" % min(mem) if mem else
            "no rollback from memory", "back to" if f["kind"] == "host_loss" else "to", workers, grown))
    # When could it grow: the host listed again (or its cool-down over), the launcher's
    # next look (0.2 s), the loss noticed from the wrappers' silence (3 s), then a commit.
    ready = f.get("returned_ns") or (f["t_ns"] if f.get("fired") else None)
    if ready is None:
        return _skip("in_place", "the host was never lost or added")
    if f["kind"] == "host_loss":
        ready = max(ready, f["t_ns"] + 3_500_000_000 + int(plan["cooldown_s"] * 1e9))
    every = int(cfg["env"]["RK_CKPT_EVERY"])
    later = [e for e in job.events_named("ckpt_committed", ready + 500_000_000)
             if e["step"] <= cfg["steps"] - 2 * every]
    if not later:
        return _skip("in_place", "no checkpoint committed after the host came back, %d steps before the end: "
                     "too late to grow (final world %s)" % (2 * every, finals[0][2] if finals else "?"))
    return _bad("in_place", "final world %s, want %d: checkpoint %d was committed %.1f s after the host came "
                "back, and the job did not grow" % (finals[0][2] if finals else "?", workers, later[0]["step"],
                                                    (later[0]["t_ns"] - ready) / 1e9))


# A request to grow this close to the job's end may find it over: the launcher looks every
# 100 ms, the workers every 50 ms, and a loaded machine delays both.
TOO_LATE_NS = 1_000_000_000


def first_end_ns(job, workers):
    """When the first worker (rank < workers, of the first attempt) ended: its end record's
    time (tools/run_loop.c's records), or None."""
    d = os.path.join(job.launch_dir, "phase-0", "attempt-0")
    times = []
    for r in range(workers):
        try:
            times.append(os.stat(os.path.join(d, "rank-%d" % r)).st_mtime_ns)
        except OSError:
            pass
    return min(times, default=None)


def check_grown_in_place(job, plan, cfg):
    """A growth onto the spare held back at launch (faults.SPARES): asked once, made in
    place (the launcher says so; no relaunch, so every worker kept its process); the final
    world W+1, or W when the spare was killed while joining (before or after it became a
    member: the others go on without it)."""
    workers, err = cfg["workers"], job.stderr_text()
    ask = [f for f in plan["faults"] if f["kind"] == "grow"][0]
    if not ask.get("fired"):
        return _skip("in_place", "the job ended before the request to grow")
    if job.phase != 0 or job.relaunches():
        return _bad("in_place", "the job was relaunched %d time(s): a growth onto a waiting spare must be made "
                    "in place" % job.relaunches())
    grew = any(e.get("world", 0) > workers for e in job.events_named("resumed"))
    end = first_end_ns(job, workers)
    if not grew and end is not None and ask["t_ns"] > end - TOO_LATE_NS:
        # The harness reads the job's progress late under load: its request may reach the
        # launcher after (or just before) the workers ended, when there is nothing to grow.
        return _skip("in_place", "asked to grow %.0f ms before the first worker ended: too late to grow" % (
            (end - ask["t_ns"]) / 1e6))
    if faults.GROWING_TEXT not in err:
        return _bad("in_place", "asked to grow at step %d, the launcher never grew in place" % ask["progress"])
    spare = workers  # rank W: the first spare
    lost = lost_ranks(job, plan)
    # A spare lost before it was admitted is declared dead and nobody recovers (it was in
    # no ring): killed_after_end's test for a member does not apply; declared dead, it is lost.
    declared = any(e.get("peer") == spare for e in job.events_named("peer_dead"))
    late = killed_after_end(job, plan) if not declared else set()
    want = workers if spare in lost and spare not in late else workers + 1
    finals = last_finals(job)
    if finals and finals[0][2] != want:
        return _bad("in_place", "final world %d, want %d (the spare %s)" % (
            finals[0][2], want, "killed while joining" if want == workers else "joined"))
    if want == workers + 1 and "grown in place to %d workers" % want not in err:
        return _bad("in_place", "final world %d but the launcher never said it grew in place" % want)
    mem = [e for e in job.events_named("resumed") if e.get("from") == "memory"]
    return _ok("in_place", "%s; %d resume(s) from memory" % (
        "grown in place to %d" % want if want > workers else
        "the spare lost while joining or after: final world %d" % want, len(mem)))


def check_grown_joined(job, plan, cfg):
    """A host whose trainers were lost, then listed again (faults.JOINS): the loss survived
    in place, the growth back made in place (workers started on the host joined the
    others while they trained; the launcher says so) with no relaunch at all, the final
    world W; with kill_newcomer (the first newcomer killed at a point of its join), no
    relaunch and a final world between the survivors' and W."""
    workers, err = cfg["workers"], job.stderr_text()
    loss = plan["faults"][0]
    if not loss.get("fired"):
        return _skip("in_place", "the host's trainers were never killed")
    if (job.phase != 0 or job.relaunches()) and nothing_to_roll_back(job, plan, workers):
        return _skip("in_place", "a slice lost in memory before any commit: rightly relaunched")
    if job.phase != 0 or job.relaunches():
        fallback = re.search(r"growth in place to \d+ workers did not complete \(([^)]*)\)", err)
        return _bad("in_place", "the job was relaunched %d time(s)%s: a host mpirun still reaches must be grown "
                    "back in place" % (job.relaunches(), " (%s)" % fallback.group(1) if fallback else ""))
    finals = last_finals(job)
    mem = [e["step"] for e in job.events_named("resumed") if e.get("from") == "memory"]
    grown = re.findall(r"grown in place to (\d+) workers in (\d+) ms", err)
    retried = len(re.findall(r"ended before it joined: the workers start another", err))
    newcomer_hit = any(f.get("fired") and (f["kind"] == "kill" and f["pick"] == "newcomer" or f["kind"] == "io")
                       for f in plan["faults"][1:])
    if finals and finals[0][2] < workers and newcomer_hit and finals[0][2] >= workers - len(loss["victims"]):
        # A newcomer killed while it joined: the others go on at the world they had (its join
        # given up), or with the ones that joined; a later try is the launcher's, not owed.
        return _ok("in_place", "the loss survived in place (%d resume(s) from memory); a newcomer killed while "
                   "joining: final world %d of %d, no relaunch%s" % (
                       len(mem), finals[0][2], workers, "; grown in place %d time(s)" % len(grown) if grown else ""))
    if finals and finals[0][2] == workers:
        if not grown:
            return _bad("in_place", "final world %d but the launcher never said it grew in place" % workers)
        return _ok("in_place", "the loss survived in place (%d resume(s) from memory); grown back in place to %d "
                   "(%s ms)%s" % (len(mem), workers, ", ".join(ms for _, ms in grown),
                                  "; %d newcomer(s) lost while joining, another started" % retried if retried else ""))
    back, end = loss.get("returned_ns"), completed_ns(job)
    if back is None:
        return _skip("in_place", "the host was never listed again (final world %s)" % (finals[0][2] if finals else "?"))
    if end is not None and end - back < JOIN_ROOM_NS:
        return _skip("in_place", "the host was listed again %.1f s before the first worker completed: too close to "
                     "the end to grow (final world %s)" % ((end - back) / 1e9, finals[0][2] if finals else "?"))
    return _bad("in_place", "final world %s, want %d: the host was listed again %s before the job's end and it "
                "did not grow back in place" % (finals[0][2] if finals else "?", workers,
                                                "%.1f s" % ((end - back) / 1e9) if end else "long"))


# Room a growth in place may need after the host is listed again: the launcher's look, one
# join per slot (about a second each), and a newcomer killed while joining (its join's
# bound, then another: recover/join_proto.c J17).
JOIN_ROOM_NS = 15_000_000_000


def completed_ns(job):
    """When the first worker of the first launch completed (its end record 'exit 0'), or None."""
    d = os.path.join(job.launch_dir, "phase-0", "attempt-0")
    times = []
    for name in os.listdir(d) if os.path.isdir(d) else []:
        if name.startswith("rank-") and name[5:].isdigit() and worker_record(job, int(name[5:])) == "exit 0":
            times.append(os.stat(os.path.join(d, name)).st_mtime_ns)
    return min(times, default=None)


def check_in_place(job, plan, cfg):
    if plan["kind"] in faults.JOINS:
        return check_grown_joined(job, plan, cfg)
    if plan["kind"] in faults.GROWS:
        return check_grown(job, plan, cfg)
    if plan["kind"] in faults.SPARES:
        return check_grown_in_place(job, plan, cfg)
    workers = cfg["workers"]
    lost = lost_ranks(job, plan)
    in_place = plan["in_place"]
    if in_place is None:  # kill_two: the victims decide (rule I1 against the first view)
        in_place = faults.majority_left(workers, lost, 0)
    if in_place and not faults.majority_left(workers, lost, 0):
        # Losses spread over time (kill_in_recovery, kill_in_rebuild on a small world)
        # may leave a minority of the first view: whether it carries on depends on whether
        # the first loss's view was agreed before the second, so either way is right.
        return _skip("in_place", "ranks %s lost of %d: the survivors may be a minority of the first view"
                     % (sorted(lost), workers))
    if not in_place:
        return _skip("in_place", "this kind may relaunch the job")
    if (job.phase != 0 or job.relaunches()) and nothing_to_roll_back(job, plan, workers):
        # Sharded state whose newest snapshot lost its partner copy with the member (the
        # loss fell inside that copy: docs/SHARDING.md), or whose slice went with its
        # partner in one fault, and no checkpoint committed yet: no survivor holds the
        # lost slice anywhere, so only a fresh start can go on.
        return _skip("in_place", "a slice lost in memory (the loss fell inside the first snapshot's partner copy, "
                     "or took a slice with its partner), before any commit: nothing to roll back to in place, "
                     "so the job was relaunched")
    if job.phase != 0 or job.relaunches():
        return _bad("in_place", "the job was relaunched %d time(s): survivors did not carry on" % job.relaunches())
    late = killed_after_end(job, plan)
    lost -= late
    finals = last_finals(job)
    if finals and finals[0][2] != workers - len(lost):
        return _bad("in_place", "final world %d, want %d - %d lost" % (finals[0][2], workers, len(lost)))
    for f in plan["faults"]:
        if f.get("fired") and f["kind"] in ("stop", "partition"):
            for r in f["victims"]:
                if r in late:
                    continue  # stopped after the last collective: nobody waited for it
                fenced = [e for e in job.events if e["_file_rank"] == r and e["event"] == "fenced"]
                refused = re.search(r"\[rekindle r%d [^]]*\] recovery stopped: survivors are not a majority" % r,
                                    job.stderr_text())
                # Cut off, a minority's stderr may never reach mpirun: its record says it stopped.
                stopped = f["kind"] == "partition" and (worker_record(job, r) or "exit 0") != "exit 0"
                if not fenced and not refused and not stopped:
                    return _bad("in_place", "rank %d was %s, but neither fenced itself nor refused to go on as "
                                "a minority" % (r, "stopped and continued" if f["kind"] == "stop" else "cut off"))
                if worker_record(job, r) == "exit 0":
                    return _bad("in_place", "rank %d was declared dead yet finished (exit 0)" % r)
                # A follower's ckpt_committed says it learned of rank 0's commit; one for a
                # step no other worker committed means the stopped worker committed it.
                others = {e["step"] for e in job.events if e["_file_rank"] != r and e["event"] == "ckpt_committed"}
                late = [e for e in job.events if e["_file_rank"] == r and e["event"] == "ckpt_committed"
                        and e["t_ns"] > f["t_ns"] and e["step"] not in others]
                if late:
                    return _bad("in_place", "rank %d committed step %d after it was %s" % (
                        r, late[0]["step"], "stopped" if f["kind"] == "stop" else "cut off"))
    return _ok("in_place", "final world %d" % (workers - len(lost)))


def worker_record(job, rank, phase=0, attempt=0):
    """How the launcher's wrapper recorded rank's end: 'exit C' or 'signal S' (the host
    and pid that follow are left out), or None."""
    try:
        with open(os.path.join(job.launch_dir, "phase-%d" % phase, "attempt-%d" % attempt, "rank-%d" % rank)) as f:
            return " ".join(f.read().split()[:2])
    except OSError:
        return None


def crashed(job, rank):
    return (worker_record(job, rank) or "").startswith("signal 9")


def cli(build, args, timeout=120):
    try:
        r = subprocess.run([os.path.join(build, "bin", "rekindle")] + args, capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        return None, "timed out after %ds" % timeout


def check_verify(job, build, damaged, plan):
    for f in plan["faults"]:
        if "verify_rc" in f and f["verify_rc"] != 1 and "not available" not in f["verify_out"]:
            return _bad("verify", "verify of the checkpoint just damaged (%s) exit %s, want 1: %s" % (
                f["damage"], f["verify_rc"], f["verify_out"].splitlines()[-1] if f["verify_out"] else ""))
    steps = committed_steps(job.ckpt)
    if not steps:
        return _skip("verify", "no committed checkpoint")
    rc, out = cli(build, ["verify", job.ckpt, "--all"])
    if rc == 2 and "not available" in out:
        return _skip("verify", "`rekindle verify` is not available in this build")
    if rc is None:
        return _bad("verify", "rekindle verify --all: " + out)
    if not damaged:
        if rc != 0:
            return _bad("verify", "rekindle verify --all exit %d: %s" % (rc, out.splitlines()[-1] if out else ""))
        return _ok("verify", "%d checkpoints verify" % len(steps))
    if rc != 1:
        return _bad("verify", "verify --all exit %d with damaged step(s) %s" % (rc, sorted(damaged)))
    for s in steps:
        want = 1 if s in damaged else 0
        rc, out = cli(build, ["verify", job.ckpt, "--step", str(s)])
        if rc != want:
            return _bad("verify", "verify --step %d exit %s, want %d: %s" % (s, rc, want, out.splitlines()[-1] if out else ""))
    return _ok("verify", "%d verify, damaged %s detected" % (len(steps) - len(damaged), sorted(damaged)))


def check_h5(job, damaged):
    import h5py  # Debian's python3-h5py
    n = 0
    for s in committed_steps(job.ckpt):
        if s in damaged:
            continue
        path = os.path.join(job.ckpt, "step-%012d" % s, "index.h5")
        try:
            with h5py.File(path, "r") as f:
                a = f.attrs
                if int(a["step"]) != s or "world_size" not in a or "format_version" not in a:
                    return _bad("h5", "%s: root attributes %s" % (path, dict(a)))
                def walk(g):  # g[key] follows the external links that visit() does not
                    count = 0
                    for key in g:
                        obj = g[key]
                        if isinstance(obj, h5py.Group):
                            count += walk(obj)
                        else:
                            obj[()]
                            count += 1
                    return count
                got = walk(f)
                if got == 0:
                    return _bad("h5", "%s: no tensor" % path)
                n += got
        except Exception as e:  # any failure to read a committed checkpoint is the finding
            return _bad("h5", "%s: %s" % (path, e))
    return _ok("h5", "%d tensors read" % n)


def still_damaged(job, damaged):
    """The damaged steps ({step: when}) that no commit after the damage replaced."""
    return {s for s, t in damaged.items()
            if not any(e["step"] == s and e["t_ns"] > t for e in job.events_named("ckpt_committed"))}


def newest_commit_before(job, t_ns, damaged):
    return max([e["step"] for e in job.events_named("ckpt_committed") if e["t_ns"] < t_ns and e["step"] not in damaged],
               default=0)


def check_fresh_resume(job, plan, damaged):
    worst = None
    for f in plan["faults"]:
        if not f.get("fired") or "t_ns" not in f:
            continue
        bound = newest_commit_before(job, f["t_ns"], damaged)
        for e in job.events_named("resumed", f["t_ns"]):
            recommitted = any(c["step"] == e["step"] and damaged.get(e["step"], 0) < c["t_ns"] < e["t_ns"]
                              for c in job.events_named("ckpt_committed"))
            if e["step"] < bound or (e["step"] in damaged and not recommitted):
                worst = "rank %d resumed step %d (%s) after the %s fault; newest commit before it: %d%s" % (
                    e["rank"], e["step"], e.get("from"), f["kind"], bound,
                    " (a damaged checkpoint)" if e["step"] in damaged else "")
    if worst:
        return _bad("fresh_resume", worst)
    return _ok("fresh_resume", "%d resume events" % len(job.events_named("resumed")))


def replay_hash(build, src, ckpt_from, step, world, train_args, scratch, mark, env_extra, timeout):
    """Final hash of rk-train started fresh from checkpoint `step` (0: from scratch) on
    `world` workers; (hash, detail). With env_extra's RK_CKPT_EVERY set to the final step,
    the replay leaves a checkpoint of it in scratch/ckpt."""
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch, mode=0o700)  # also the replay's RK_RUN_DIR: the job user's alone
    os.chmod(scratch, 0o700)
    ck = os.path.join(scratch, "ckpt")
    os.makedirs(ck)
    if step > 0:
        shutil.copytree(os.path.join(ckpt_from, "step-%012d" % step), os.path.join(ck, "step-%012d" % step))
    env = dict(os.environ)
    env.update(env_extra)
    env.update({"RK_CKPT_DIR": ck, "CHAOS_RUN": mark, "RK_RUN_DIR": scratch})
    env.update(MPI_ENV)
    for k in ("RK_FAULT", "RK_FAULT_PATH", "RK_EVENT_LOG", "RK_MIN_WORLD"):
        env.pop(k, None)
    cmd = [os.path.join(build, "bin", "rekindle"), "run", "-n", str(world), "--",
           os.path.join(build, "bin", "rk-train")] + train_args
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, "replay timed out after %ds" % timeout
    finals = [m for m in map(FINAL_RE.match, r.stdout.splitlines()) if m]
    hashes = {m.group(3) for m in finals}
    worlds = sorted({int(m.group(2)) for m in finals})
    if r.returncode == 0 and worlds != [world]:
        # a fault-free replay that lost a worker (a false death: seen with the 2-core
        # machine 8 times oversubscribed) ends on fewer workers, with another hash: it is
        # no reference for the run's hash, and says so rather than comparing
        with open(os.path.join(scratch, "replay.log"), "w") as f:
            f.write("$ %s\n--- stdout\n%s--- stderr\n%s" % (" ".join(cmd), r.stdout, r.stderr))
        return None, "the fault-free replay on %d workers itself lost workers (final world %s; whole output: %s)" % (
            world, worlds, os.path.join(scratch, "replay.log"))
    if r.returncode != 0 or len(hashes) != 1:
        with open(os.path.join(scratch, "replay.log"), "w") as f:  # kept with a failing run
            f.write("$ %s\n--- stdout\n%s--- stderr\n%s" % (" ".join(cmd), r.stdout, r.stderr))
        return None, "replay exit %d, hashes %s (whole output: %s): %s" % (
            r.returncode, sorted(hashes), os.path.join(scratch, "replay.log"), r.stderr.strip()[-300:])
    return hashes.pop(), "replay from step %d on %d workers" % (step, world)


def segments(job, cfg):
    """The job's history as segments, oldest first: (t_ns, step, world) of each membership
    it resumed in (the first resume event of each epoch, its world from ring_rebuilt; a
    relaunch's resume from disk too), after the launch's own (0, 0, workers)."""
    worlds = {e["epoch"]: e["world"] for e in job.events_named("ring_rebuilt")}
    start = cfg.get("start_world", cfg["workers"])
    first = {}
    for e in sorted(job.events_named("resumed"), key=lambda e: e["t_ns"]):
        key = (e.get("epoch"), e["step"], e.get("from"), e.get("world"))
        if key not in first:  # 'world' is in the event since it was added; else its epoch's
            first[key] = (e["t_ns"], e["step"], e.get("world", worlds.get(e.get("epoch"), start)))
    return [(0, 0, start)] + sorted(first.values())


def state_at(job, cfg, step, before_ns, args, scratch, depth=0, trust=True):
    """A checkpoint directory holding the state the job had at `step` when it resumed it at
    before_ns, and how it was had: the job's own committed checkpoint of that step (when
    `trust`), else a replay of the part of its history that produced it (a snapshot held
    in memory, taken at every step, is on disk only at RK_CKPT_EVERY's steps): from the
    state of the latest membership before before_ns that resumed at a step <= `step`, on
    that membership's world, to `step`, checkpointing it. With trust False the whole
    history is replayed from scratch, world by world. (None, why) if it cannot be had."""
    if step == 0 or (trust and os.path.isdir(os.path.join(job.ckpt, "step-%012d" % step))):
        return job.ckpt, "the job's checkpoint %d" % step if step else "scratch"
    if depth > 8:
        return None, "more than 8 segments of history to replay"
    history = segments(job, cfg)  # its first, (0, 0, start world), is before any resume at any step
    t0, s0, world0 = max(g for g in history if g[0] < before_ns and g[1] <= step)
    where, how = state_at(job, cfg, s0, t0 if t0 else 1, args, scratch, depth + 1, trust)
    if where is None or s0 == step:
        return where, how
    seg = os.path.join(scratch, "seg%d" % depth)
    a = list(args)
    a[a.index("--steps") + 1] = str(step)
    env = dict(cfg["env"], RK_CKPT_EVERY=str(step))
    h, detail = replay_hash(cfg["build"], cfg["src"], where, s0, world0, a, seg, job.mark + "/replay-seg",
                            env, cfg["run_timeout"])
    if h is None:
        return None, "replaying steps %d..%d on %d workers: %s" % (s0, step, world0, detail)
    return os.path.join(seg, "ckpt"), "%s, then steps %d..%d on %d workers" % (how, s0, step, world0)


def check_replay(job, plan, cfg, damaged, cache, scratch, sabotage):
    finals = last_finals(job)
    if plan["expect"] == "stop" or not finals:
        return _skip("replay", "no final hash to compare (the run %s)" % (
            "had to stop" if plan["expect"] == "stop" else "did not finish"))
    resumes = sorted(job.events_named("resumed"), key=lambda e: e["t_ns"])
    step = resumes[-1]["step"] if resumes else 0
    world, got = finals[0][2], finals[0][3]
    if step in damaged:
        return _bad("replay", "the run resumed from damaged checkpoint %d" % step)
    args = list(cfg["train_args"])
    if "replay" in sabotage:
        args[args.index("--seed") + 1] = str(int(args[args.index("--seed") + 1]) + 1)
    key = (world, tuple(args))
    if step == 0 and key in cache:
        want, how = cache[key], "fault-free run on %d workers (cached)" % world
    else:
        # An elastic kind's history is replayed whole, world by world: the checkpoint the
        # growth resumed from is checked too, not taken as given.
        where, prefix = state_at(job, cfg, step, resumes[-1]["t_ns"] if resumes else 0, args, scratch + "-state",
                                 trust=plan["kind"] not in faults.GROWS | faults.SPARES)
        if where is None:
            return _bad("replay", "the state of resumed step %d: %s" % (step, prefix))
        want, how = replay_hash(cfg["build"], cfg["src"], where, step, world, args, scratch,
                                job.mark + "/replay", cfg["env"], cfg["run_timeout"])
        how = "%s; %s" % (prefix, how)
        if want is None:
            return _bad("replay", how)
        if step == 0:
            cache[key] = want
    if want != got:
        return _bad("replay", "final hash %s, %s gives %s" % (got, how, want))
    return _ok("replay", "%s: %s" % (how, want))


def check_steps_lost(job, cfg):
    """Snapshots at every step (RK_SNAPSHOT_EVERY=1, the default): a rollback from memory
    loses at most one step (the `resumed` event's steps_lost: the last step a survivor
    finished, plus one, minus the step resumed), unless a snapshot failed meanwhile
    (snapshot_failed: the generation before is all there is) or a disk write held the
    older generation while the newest's partner copy was lost with its sender
    (docs/DESIGN.md): those are named, not counted."""
    every = int(cfg["env"].get("RK_SNAPSHOT_EVERY", "1"))
    if every != 1:
        return _skip("steps_lost", "RK_SNAPSHOT_EVERY=%d" % every)
    memory = [e for e in job.events_named("resumed") if e.get("from") == "memory"]
    if not memory:
        return _skip("steps_lost", "no rollback from memory")
    worst = max(memory, key=lambda e: e.get("steps_lost", 0))
    lost = worst.get("steps_lost", 0)
    if lost <= 1:
        return _ok("steps_lost", "%d rollbacks from memory, at most %d step lost" % (len(memory), lost))
    failed = job.events_named("snapshot_failed")
    if failed:
        return _ok("steps_lost", "%d steps lost at step %d, after %d failed snapshot(s)" % (lost, worst["step"],
                                                                                           len(failed)))
    return _bad("steps_lost", "rank %d resumed step %d from memory losing %d steps (epoch %s)" % (
        worst["rank"], worst["step"], lost, worst.get("epoch")))


def check_no_leftover(leftovers):
    if leftovers:
        return _bad("no_leftover", "alive after the run: " + ", ".join("%d %s" % p for p in leftovers[:8]))
    return _ok("no_leftover")


def check_no_temp(job, plan):
    rc = job.rcs[-1] if job.rcs else None
    if plan["expect"] != "finish" or rc != 0:
        return _skip("no_temp", "the job did not end cleanly")
    if plan["kind"] in faults.LEAVES_TEMP:
        return _skip("no_temp", "a writer stuck on a dead disk keeps its attempt's directory until the next start")
    temp = sorted(e for e in os.listdir(job.ckpt) if e.startswith("."))
    return _bad("no_temp", "left in %s: %s" % (job.ckpt, temp)) if temp else _ok("no_temp")


def check_no_false_dead(job, plan):
    hit, stopped, whole = set(), set(), False
    for f in plan["faults"]:
        if not f.get("fired"):
            continue
        if f["kind"] in ("stop", "partition"):
            stopped |= set(f["victims"])
        if f["kind"] in ("kill", "stop", "host_loss", "partition"):
            hit |= set(f["victims"])
            whole |= f["pick"] == "all"
        elif f["kind"] in ("relaunch", "corrupt"):
            whole = True
        elif f["kind"] == "io" and crashed(job, f["rank"]):
            hit.add(f["rank"])
    if whole:
        return _skip("no_false_dead", "the whole job was killed")
    # Stopping the job to grow it ends every worker: deaths seen meanwhile are that stop.
    stops = growth_stops(job)
    wrong = sorted({(e["rank"], e["peer"]) for e in job.events_named("peer_dead")
                    if e.get("peer") not in hit and e["rank"] not in stopped
                    and not any(t0 <= e["t_ns"] < t1 for t0, t1 in stops)})
    hit |= wedged(job)
    wrong = [w for w in wrong if w[1] not in hit]
    if wrong:
        return _bad("no_false_dead", "declared dead but never killed or stopped (observer, peer): %s" % wrong[:6])
    # A stop is not an end: the parent of a stopped worker never reports it (its silence
    # does); and with the parent's report turned off (RK_PARENT_REPORT=0) nothing is.
    killed = set()
    for f in plan["faults"]:
        if f.get("fired") and f["kind"] == "kill":
            killed |= set(f["victims"])
    by_parent = {(e["rank"], e["peer"]) for e in job.events_named("peer_dead") if e.get("via") == "parent"}
    if not plan.get("parent_report", True) and by_parent:
        return _bad("no_false_dead", "reported by a parent with RK_PARENT_REPORT=0 (observer, peer): %s"
                    % sorted(by_parent)[:6])
    stopped_only = stopped - killed
    wrong = sorted(w for w in by_parent if w[1] in stopped_only)
    if wrong:
        return _bad("no_false_dead", "a stopped worker reported dead by its parent (observer, peer): %s" % wrong[:6])
    return _ok("no_false_dead", "wedged inside MPI and left: %s" % sorted(wedged(job)) if wedged(job) else "")


def check_events(job):
    if job.bad_event_lines:
        return _bad("events", "%d malformed lines, first %s" % (len(job.bad_event_lines), job.bad_event_lines[0]))
    # a death was learned from the worker's parent or from its silence (docs/DETECTOR.md)
    odd = [e for e in job.events_named("peer_dead") if e.get("via") not in ("parent", "silence")]
    if odd:
        return _bad("events", "%d peer_dead events without via parent|silence, first %s" % (len(odd), odd[0]))
    return _ok("events", "%d lines" % len(job.events))


def latencies(job, plan):
    """Per fired kill/stop fault: kill -> first peer_dead naming a victim (detect_ms),
    kill -> the last survivor's first resume after it (recover_ms), and steps lost
    (rank 0's steps done at the kill minus the step resumed); how that first death was
    learned (via: parent or silence) and whether the parent's report was on."""
    out = []
    # A growth's relaunch resumes every worker again, from disk: not the fault's recovery.
    grown = min((t0 for t0, _ in growth_stops(job)), default=float("inf"))
    for f in plan["faults"]:
        if f.get("fired") and f["kind"] == "grow":  # request -> the first resume at the grown world
            t = f["t_ns"]
            at = [e["t_ns"] for e in job.events_named("resumed", t) if e.get("world", 0) > job.workers]
            out.append({"fault": "grow", "grow_ms": (min(at) - t) / 1e6 if at else None})
        if not f.get("fired") or f["kind"] not in ("kill", "stop", "host_loss", "partition") or f["pick"] == "all":
            continue
        t = f["t_ns"]
        dead_ev = sorted((e for e in job.events_named("peer_dead", t) if e.get("peer") in f["victims"]),
                         key=lambda e: e["t_ns"])
        dead = [e["t_ns"] for e in dead_ev]
        first = {}
        for e in sorted(job.events_named("resumed", t), key=lambda e: e["t_ns"]):
            if e["t_ns"] < grown:
                first.setdefault(e["rank"], e)
        # a spare killed while it joins is not a member's loss: counted apart
        kind = "kill_spare" if plan["kind"] == "kill_joining" else f["kind"]
        rec = {"fault": kind, "victims": f["victims"], "progress": f["progress"],
               "detect_ms": (min(dead) - t) / 1e6 if dead else None,
               "recover_ms": (max(e["t_ns"] for e in first.values()) - t) / 1e6 if first else None,
               "steps_lost": f["progress"] - min(e["step"] for e in first.values()) if first else None,
               "from": sorted({e.get("from") for e in first.values()}) if first else None,
               "via": dead_ev[0].get("via") if dead_ev else None, "parent_report": plan.get("parent_report", True)}
        out.append(rec)
    return out
