"""chaos/faults.py - the kinds of fault, how a run's schedule is drawn, and how each is
injected into a live Job.

A schedule is drawn from random.Random(f"{campaign seed}/{run index}") only, so a run is
reproduced by its campaign seed and index alone (chaos/run --seed S --only I).

Kinds (KINDS below; `--faults` picks among them):
  kill_worker       SIGKILL of one random worker at a random moment
  kill_coord        SIGKILL of the coordinator (the lowest live rank)
  kill_two          SIGKILL of two workers at the same instant
  kill_in_recovery  SIGKILL of one worker, then of another as soon as a death is declared
  kill_in_rebuild   SIGKILL of one worker; another dies inside the ring's rebuild that
                    follows, after the rebuild's handshake (RK_FAULT=rebuild@0=crash on that
                    rank, first launch only): no survivor may freeze
  stop_cont         SIGSTOP of a worker for longer than the detector's timeout, then SIGCONT:
                    it must fence itself, not rejoin
  job_kill          SIGKILL of every worker: the job dies whole, `rekindle run` relaunches it
  relaunch          SIGKILL of the launcher and everything under it; the harness relaunches
  io_fault          a checkpoint I/O fault (RK_FAULT=OP@N=KIND) on one rank, first launch only
  disk_hang         one rank's checkpoint disk stops answering for good (RK_FAULT=OP@N=hang,
                    first launch only; RK_TIMEOUT_MS 4000): every process must finish in its
                    bounds, the stuck checkpoint is never committed
  corrupt           between two launches: a bit flipped in, or a file of, the newest
                    committed checkpoint truncated
  hb_jitter         heartbeat trouble for a few seconds on the run's own loopback (a private
                    network namespace): tc netem delay, jitter and loss where the kernel
                    has netem, else iptables dropping 5-10% of UDP (the heartbeats). No
                    worker may be declared dead for it
  min_world         RK_MIN_WORLD = the world size and a worker killed: the job must stop
                    with the clear error, not hang and not continue
Kinds between hosts (chaos/run --hosts K: the job runs on K hosts made by scripts/hosts,
network namespaces joined by a bridge, over TCP):
  host_loss         every process of one host (Open MPI's daemon, the launcher's wrappers,
                    the trainers) SIGKILLed at once: the others go on in place
  partition         iptables in one host's namespace drops everything it sends or receives
                    for a few seconds, then the link heals: the majority goes on in place;
                    the host's workers fence or stop, never exit 0, and commit nothing
  link_loss         iptables drops x% (2, 5 or 10) of what one host sends and receives, at
                    random, for a few seconds (no netem in every kernel): slower, but no
                    worker may be declared dead for it
Elastic kinds between hosts: the job runs under `rekindle run --host-discovery-script`
listing the hosts the harness says are up (each host's slots summing to the workers), for
--grow-steps steps, and must end at its full size:
  host_return       host_loss, then the host comes back after 1-3 s: either the harness
                    lists it again ('relist': it was taken off the list at the loss), or it
                    stays listed and the launcher's --blacklist-cooldown of that length keeps
                    it out ('cooldown'). The others go on in place; the job grows back to W
                    at a checkpoint after the host's return (a relaunch that is no restart)
  host_add          the job starts on the hosts but one; that host is listed at a random
                    step (and, half the time, RK_RUN_DIR/grow touched to push the news):
                    the job grows to W at its next checkpoint
Elastic kinds that grow in place (`rekindle run --host-discovery-script`, growth in place
by default): the host stays reachable by mpirun (its daemon lives), so the launcher must
grow back by starting workers there while the job trains, never by a relaunch:
  host_relist       the trainers of one host SIGKILLed (its daemon and the wrappers live) and
                    the host taken off the list (its scheduler found it unhealthy); listed
                    again 1-3 s later: the others go on in place, and the job grows back to
                    W in place (workers started on the host join from the others' memory)
  kill_newcomer     host_relist, and the first worker started to grow in place killed at a
                    random point of its join: by a fault point of its own (RK_FAULT join@0,
                    rebuild@0, join@1 or allreduce@0 =crash, on its slot W) or SIGKILLed
                    from outside 0-800 ms after the launcher said it grows in place (before
                    contact, inside MPI_Init or the merge, in the state transfer, in its
                    first allreduce). The others go on with one bounded wait; the launcher
                    starts another, and the job still ends at W, grown in place
Growth in place onto a spare held back at launch (`rekindle run --spares 1`, this host):
  grow_spare        RK_RUN_DIR/grow written at a random checkpoint's commit: the job must grow to W+1 in
                    place (no relaunch, the workers keep their processes), the newcomer
                    taking the newest snapshot from the others' memory
  kill_joining      the same request, and the spare killed at a random point of its join:
                    by a fault point of its own (RK_FAULT join@0, rebuild@0, join@1 or
                    allreduce@0 =crash: the decision arrived, inside the ring's rebuild, before
                    the state is sent, in its first allreduce) or SIGKILLed from outside
                    0-150 ms after the launcher said it grows in place. The others go on at W
                    in place, from their memory, with one bounded wait
Moments: 'step' (a random step), 'snapshot' (the step whose rk_step_done takes a
snapshot), 'persist' (a few ms after it: the write is in flight), 'commit' (as soon as a
ckpt_committed event is seen), 'dead' (as soon as a peer_dead event is seen: recovery).
"""
import os
import random
import shutil
import signal
import subprocess

from job import marked_processes, now_ns

KINDS = ["kill_worker", "kill_coord", "kill_two", "kill_in_recovery", "kill_in_rebuild", "stop_cont",
         "job_kill", "relaunch", "io_fault", "disk_hang", "corrupt", "hb_jitter", "min_world",
         "host_loss", "partition", "link_loss", "host_return", "host_add", "host_relist", "kill_newcomer",
         "grow_spare", "kill_joining"]
# Kinds that need the job on several hosts (chaos/run --hosts K).
NEED_HOSTS = {"host_loss", "partition", "link_loss", "host_return", "host_add", "host_relist", "kill_newcomer"}
# Kinds whose job runs elastic (host discovery) and must grow to its full size.
GROWS = {"host_return", "host_add", "host_relist", "kill_newcomer"}
# Of those, the kinds whose growth must be made in place (workers started while it trains).
JOINS = {"host_relist", "kill_newcomer"}
# Kinds whose job is launched with a spare held back (--spares 1) and asked to grow onto it.
SPARES = {"grow_spare", "kill_joining"}
# The spare's own fault points while it joins (recover/recovery.c G4; tests/test_grow.c).
JOIN_FAULTS = ["join@0=crash", "rebuild@0=crash", "join@1=crash", "allreduce@0=crash"]
# Kinds whose run must survive without any relaunch (in place, by the recovery coordinator).
IN_PLACE = {"kill_worker", "kill_coord", "kill_in_recovery", "kill_in_rebuild", "stop_cont", "io_fault",
            "disk_hang", "hb_jitter", "host_loss", "partition", "link_loss", "grow_spare", "kill_joining"}
# A writer stuck on a dead disk keeps its attempt's temporary directory (removed at the
# next start): these kinds may end with one.
LEAVES_TEMP = {"disk_hang"}

IO_OPS = ["write", "sync", "rename", "syncdir", "open", "odirect", "truncate"]
IO_KINDS = ["eio", "enospc", "short", "crash"]
HANG_OPS = ["write", "sync", "rename", "open"]


# What the launcher says when it asks the job to grow onto its spares, and when it starts
# workers to grow in place (tools/run_grow.c).
GROWING_TEXT = "growing in place from"
JOINING_TEXT = "started on"


def majority_left(world, killed, lowest):
    """Whether the survivors of `killed` may continue (recovery rule I1: a strict majority
    of the previous view, or exactly half of it holding its lowest rank)."""
    left = world - len(killed)
    return 2 * left > world or (2 * left == world and lowest not in killed)


def draw(rng, kinds, workers, steps, every, hosts=0, grow_steps=0):
    """The run's plan: {'kind', 'faults': [fault dicts], 'env', 'max_restarts', 'netns',
    'expect'}. expect: 'finish' (completes, in place if the kind is in IN_PLACE) or
    'stop' (ends with the min_world error). A kind of SPARES adds 'spares' (held back at
    launch; rank W is the spare). An elastic kind (GROWS) adds 'steps' (the
    run's, grow_steps), 'cooldown_s' (the launcher's --blacklist-cooldown) and
    'unlisted' (the host left off the list at the start, or None)."""
    kind = rng.choice(kinds)
    plan = {"kind": kind, "faults": [], "env": {}, "max_restarts": 2, "netns": False,
            "expect": "finish", "in_place": kind in IN_PLACE}
    if kind in GROWS:
        # early enough that the host is back, and a checkpoint or two later, well before the end
        plan.update(steps=grow_steps, cooldown_s=0.5, unlisted=None)
        early = {"step": rng.randint(max(every + 1, grow_steps // 10), max(every + 2, grow_steps // 4))}
    lo, hi = max(every + 1, steps // 6), max(every + 2, (steps * 3) // 4)

    def moment():
        m = rng.choice(["step", "snapshot", "persist", "commit"])
        s = rng.randint(lo, hi)
        if m in ("snapshot", "persist"):
            s = (s // every) * every + every - 1  # rk_step_done(s) takes the snapshot of s+1
        return {"moment": m, "step": s, "delay_ms": rng.randint(1, 30) if m == "persist" else 0}

    def fault(k, **kw):
        f = {"kind": k, "fired": False}
        f.update(moment())
        f.update(kw)
        plan["faults"].append(f)
        return f

    if kind == "kill_worker":
        fault("kill", pick="random_not_lowest", n=1)
    elif kind == "kill_coord":
        fault("kill", pick="lowest", n=1)
    elif kind == "kill_two":
        fault("kill", pick="random", n=2)
    elif kind == "kill_in_recovery":
        fault("kill", pick="random_not_lowest", n=1)
        fault("kill", pick="random", n=1, moment="dead", delay_ms=rng.randint(0, 50))
    elif kind == "kill_in_rebuild":
        # Neither victim is the lowest rank, so two losses of four keep a quorum (I1).
        pool = list(range(1, workers)) if workers > 2 else list(range(workers))
        first, rank = rng.sample(pool, 2) if len(pool) >= 2 else (pool[0], pool[0])
        fault("kill", pick="given", ranks=[first], n=1)
        plan["env"] = {"RK_FAULT": "rebuild@0=crash", "CHAOS_FAULT_RANK": str(rank), "CHAOS_FAULT_ATTEMPT": "0"}
        plan["faults"].append({"kind": "io", "spec": plan["env"]["RK_FAULT"], "rank": rank,
                               "moment": "start", "step": -1, "delay_ms": 0, "fired": False})
    elif kind == "stop_cont":
        fault("stop", pick="random_not_lowest", n=1, hold_ms=rng.randint(2500, 4000))
    elif kind == "job_kill":
        fault("kill", pick="all", n=0)
        plan["in_place"] = False
    elif kind == "relaunch":
        fault("relaunch", pick="all", n=0)
    elif kind == "io_fault":
        op, k = rng.choice(IO_OPS), rng.choice(IO_KINDS)
        if op == "odirect":
            k = "einval"  # the file system refuses O_DIRECT: the fallback must be loud and work
        rank = rng.randrange(workers)
        plan["env"] = {"RK_FAULT": "%s@%d=%s" % (op, rng.randint(0, 6), k),
                       "CHAOS_FAULT_RANK": str(rank), "CHAOS_FAULT_ATTEMPT": "0"}
        plan["faults"].append({"kind": "io", "spec": plan["env"]["RK_FAULT"], "rank": rank,
                               "moment": "start", "step": -1, "delay_ms": 0, "fired": False})
    elif kind == "disk_hang":
        rank = rng.randrange(workers)
        plan["env"] = {"RK_FAULT": "%s@%d=hang" % (rng.choice(HANG_OPS), rng.randint(0, 4)),
                       "RK_TIMEOUT_MS": "4000", "CHAOS_FAULT_RANK": str(rank), "CHAOS_FAULT_ATTEMPT": "0"}
        plan["faults"].append({"kind": "io", "spec": plan["env"]["RK_FAULT"], "rank": rank,
                               "moment": "start", "step": -1, "delay_ms": 0, "fired": False})
    elif kind == "corrupt":
        fault("corrupt", pick="all", n=0, how=rng.choice(["bitflip", "truncate"]), moment="commit",
              step=rng.randint(2 * every, max(2 * every, (steps * 2) // 3)) // every * every)
    elif kind == "hb_jitter":
        plan["netns"] = True
        fault("netem", pick="all", n=0, moment="step", step=rng.randint(lo, max(lo, steps // 3)), delay_ms=0, hold_ms=rng.randint(2000, 4000),
              delay=rng.randint(5, 40), jitter=rng.randint(0, 10), loss=rng.choice([2, 5, 10]))
    elif kind == "min_world":
        plan["env"] = {"RK_MIN_WORLD": str(workers)}
        plan["max_restarts"] = 0
        plan["expect"] = "stop"
        plan["in_place"] = False
        fault("kill", pick="random_not_lowest", n=1)
    elif kind == "host_loss":
        fault("host_loss", pick="host", n=0, host=rng.randrange(hosts))
    elif kind == "partition":
        fault("partition", pick="host", n=0, host=rng.randrange(hosts), hold_ms=rng.randint(3000, 5000))
    elif kind == "link_loss":
        fault("link_loss", pick="host", n=0, host=rng.randrange(hosts), hold_ms=rng.randint(2000, 4000),
              loss=rng.choice([2, 5, 10]))
    elif kind == "host_return":
        how, hold = rng.choice(["relist", "cooldown"]), rng.randint(1000, 3000)
        if how == "cooldown":
            plan["cooldown_s"] = hold / 1000.0
        fault("host_loss", pick="host", n=0, host=rng.randrange(hosts), returns=how, hold_ms=hold, **early)
    elif kind == "host_add":
        plan["unlisted"] = rng.randrange(hosts)
        fault("host_add", pick="host", n=0, host=plan["unlisted"], push=rng.random() < 0.5, **early)
    elif kind in JOINS:
        hold = rng.randint(1000, 3000)
        fault("kill", pick="host", n=0, host=rng.randrange(hosts), returns="relist", hold_ms=hold, **early)
        if kind == "kill_newcomer":
            if rng.random() < 0.5:  # the first worker started to grow, slot W (tools/run_worker.c RK_RUN_SLOT)
                spec = rng.choice(JOIN_FAULTS)
                plan["env"] = {"RK_FAULT": spec, "CHAOS_FAULT_RANK": str(workers), "CHAOS_FAULT_ATTEMPT": "0"}
                plan["faults"].append({"kind": "io", "spec": spec, "rank": workers, "moment": "start", "step": -1,
                                       "delay_ms": 0, "fired": False})
            else:
                fault("kill", pick="newcomer", n=1, moment="joining", step=-1, delay_ms=rng.randint(0, 800))
    elif kind in SPARES:
        plan["spares"] = 1
        # early: room after it for the join, a loss and its recovery, and a checkpoint or two
        # at a commit: the event log is read as it is written, where rank 0's step lines
        # reach the harness through mpirun, late on a loaded machine (a request after the
        # job's end grows nothing)
        fault("grow", pick="all", n=0, moment="commit", step=rng.randint(lo, max(lo, steps // 3)) // every * every,
              delay_ms=0)
        if kind == "kill_joining":
            if rng.random() < 0.5:
                spec = rng.choice(JOIN_FAULTS)
                plan["env"] = {"RK_FAULT": spec, "CHAOS_FAULT_RANK": str(workers), "CHAOS_FAULT_ATTEMPT": "0"}
                plan["faults"].append({"kind": "io", "spec": spec, "rank": workers, "moment": "start", "step": -1,
                                       "delay_ms": 0, "fired": False})
            else:
                fault("kill", pick="given", ranks=[workers], n=1, moment="growing", step=-1,
                      delay_ms=rng.randint(0, 150))
    if kind in ("kill_two",):
        plan["in_place"] = None  # decided when the victims are known (majority rule)
    return plan


def due(f, job, t_now_ns):
    """Whether fault f should fire now (it arms when its moment is seen, then waits
    delay_ms)."""
    if f["fired"] or f.get("failed") or t_now_ns < f.get("retry_ns", 0):
        return False
    if "armed_ns" not in f:
        m = f["moment"]
        ok = (m == "start"
              or (m in ("step", "snapshot", "persist") and job.last_step >= f["step"])
              or (m == "commit" and any(e.get("step", -1) >= f["step"] for e in job.events_named("ckpt_committed")))
              or (m == "dead" and job.events_named("peer_dead"))
              or (m == "growing" and GROWING_TEXT in job.stderr_text())
              or (m == "joining" and JOINING_TEXT in job.stderr_text()))
        if not ok:
            return False
        f["armed_ns"] = t_now_ns
    return t_now_ns >= f["armed_ns"] + f["delay_ms"] * 1_000_000


def pick_victims(f, rng, live):
    ranks = sorted(live)
    if not ranks:
        return []
    if f["pick"] == "lowest":
        return ranks[:1]
    if f["pick"] == "all":
        return ranks
    if f["pick"] == "given":
        return [r for r in f["ranks"] if r in live]
    if f["pick"] == "newcomer":  # the first worker started while the job trains
        return [r for r in ranks if r >= f["workers"]][:1]
    pool = ranks[1:] if f["pick"] == "random_not_lowest" and len(ranks) > 1 else ranks
    return rng.sample(pool, min(f["n"], len(pool)))


def _signal(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def netem(job, on, f=None):
    """Starts (on) or ends heartbeat trouble on the run's private loopback: tc netem
    (delay, jitter, loss of every packet) where the kernel has it, else iptables dropping
    that share of UDP datagrams (the detector's heartbeats; loss only, no delay). Records
    in f what was really applied. Returns None or why it could not."""
    ns = ["nsenter", "-t", str(job.proc.pid), "-n", "--"]

    def sh(cmd):
        try:
            r = subprocess.run(ns + cmd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
        return None if r.returncode == 0 else "%s: %s" % (cmd[0], r.stderr.strip())

    if not on:
        return sh(job.netem_off) if getattr(job, "netem_off", None) else None
    em = ["netem", "delay", "%dms" % f["delay"]] + (["%dms" % f["jitter"]] if f["jitter"] else [])
    em += ["loss", "%d%%" % f["loss"]] if f["loss"] else []
    err = sh(["tc", "qdisc", "add", "dev", "lo", "root"] + em)
    if err is None:
        job.netem_off, f["scope"] = ["tc", "qdisc", "del", "dev", "lo", "root"], "tc netem, all loopback traffic"
        return None
    rule = ["OUTPUT", "-p", "udp", "-m", "statistic", "--mode", "random", "--probability",
            "%.2f" % (max(f["loss"], 5) / 100.0), "-j", "DROP"]
    err2 = sh(["iptables", "-A"] + rule) if shutil.which("iptables") else "iptables is not installed"
    if err2 is None:
        job.netem_off = ["iptables", "-D"] + rule
        f["scope"] = "iptables: %d%% of UDP dropped (no netem in this kernel: no delay)" % max(f["loss"], 5)
        f["delay"] = f["jitter"] = 0
        f["loss"] = max(f["loss"], 5)
        return None
    return "neither tc netem (%s) nor iptables (%s)" % (err, err2)


def inject(f, job, rng, world_start):
    """Fires fault f at the live job. Records in f: t_ns, victims, progress (rank 0's
    steps done when it fired). Returns None, or why it could not fire."""
    f["fired"] = True
    f["t_ns"] = now_ns()
    f["progress"] = job.last_step + 1
    f["committed_before"] = max([e["step"] for e in job.events_named("ckpt_committed")], default=0)
    k = f["kind"]
    if k == "io":
        f["victims"] = [f["rank"]]
        return None
    if k == "grow":  # the scheduler's request to grow by one (docs/LAUNCHER.md)
        f["victims"] = []
        path = os.path.join(job.run_dir(), "grow")
        with open(path + ".tmp", "w") as fh:
            fh.write("1\n")
        os.rename(path + ".tmp", path)
        return None
    # Reading every process's environment may take seconds on a loaded machine (/proc/PID/
    # environ waits for a process that is changing its memory map): after the above, which
    # need none of it.
    live = job.live_workers()
    f["t_ns"] = now_ns()  # a kill's time is when it is sent (the latencies count from it)
    if k == "kill" and f["pick"] == "host":  # its trainers alone: its daemon and the wrappers live
        host = f["host"] = job.hosts.names[f["host"]]
        victims = sorted(r for r, pid in live.items() if job.host_of(pid) == host)
        if not victims:
            f["fired"] = False
            return "no live worker on " + host
        f["victims"] = victims
        if f.get("returns") == "relist":  # the scheduler takes it off the list, then lists it again
            job.list_host(host, False)
            f["return_ns"] = f["t_ns"] + f["hold_ms"] * 1_000_000
        _signal([live[r] for r in victims], signal.SIGKILL)
        return None
    if k == "kill" and f["pick"] == "newcomer":
        f["workers"] = world_start
        victims = pick_victims(f, rng, live)
        if not victims:  # not started yet (or gone): looked for again every 20 ms, for 5 s
            f["fired"], f["retry_ns"] = False, now_ns() + 20_000_000
            return None if now_ns() < f["armed_ns"] + 5_000_000_000 else "no worker started to grow in place"
        f["victims"] = victims
        _signal([live[r] for r in victims], signal.SIGKILL)
        return None
    if k in ("kill", "stop", "relaunch", "corrupt"):
        victims = pick_victims(f, rng, live)
        if not victims:
            f["fired"] = False
            return "no live worker to hit"
        f["victims"] = victims
        if k == "kill":
            _signal([live[r] for r in victims], signal.SIGKILL)
        elif k == "stop":
            _signal([live[r] for r in victims], signal.SIGSTOP)
            f["cont_ns"] = f["t_ns"] + f["hold_ms"] * 1_000_000
            f["stopped_pids"] = [live[r] for r in victims]
        else:  # relaunch, corrupt: the whole run, launcher included
            job.kill_everything()
        return None
    if k in NEED_HOSTS:
        host = job.hosts.names[f["host"]]
        f["host"] = host
        if k == "host_add":
            f["victims"] = []
            job.list_host(host, True)
            if f["push"]:  # the scheduler's news pushed: the launcher runs its script at once
                open(os.path.join(job.run_dir(), "grow"), "w").close()
            return None
        on = {r: pid for r, pid in live.items() if job.host_of(pid) == host}
        f["victims"] = sorted(on) if k != "link_loss" else []
        if k == "host_loss":
            procs = [pid for pid in marked_processes(job.mark) if job.host_of(pid) == host]
            if not procs:
                f["fired"] = False
                return "no process of the run on " + host
            if f.get("returns") == "relist":  # the scheduler takes the dead host off the list
                job.list_host(host, False)
            _signal(procs, signal.SIGKILL)
            f["processes"] = len(procs)
            if f.get("returns"):
                f["return_ns"] = f["t_ns"] + f["hold_ms"] * 1_000_000
            return None
        f["end_ns"] = f["t_ns"] + f["hold_ms"] * 1_000_000
        if k == "partition":
            f["rules"] = [["INPUT", "-i", "eth0", "-j", "DROP"], ["OUTPUT", "-o", "eth0", "-j", "DROP"]]
        else:
            p = "%.2f" % (f["loss"] / 100.0)
            f["rules"] = [[chain, io, "eth0", "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"]
                          for chain, io in (("INPUT", "-i"), ("OUTPUT", "-o"))]
            f["scope"] = "iptables: %d%% of %s's packets dropped each way" % (f["loss"], host)
        for rule in f["rules"]:
            err = _host_sh(job, host, ["iptables", "-I"] + rule)
            if err:
                heal(job, f)
                return err
        return None
    if k == "netem":
        f["victims"] = []
        err = netem(job, True, f)
        f["end_ns"] = f["t_ns"] + f["hold_ms"] * 1_000_000
        return err
    return "unknown fault kind " + k


def _host_sh(job, host, cmd):
    if not shutil.which(cmd[0]):
        return "%s is not installed (scripts/install-deps installs it)" % cmd[0]
    try:
        r = subprocess.run(job.hosts.ns(host) + cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if r.returncode == 0 else "%s on %s: %s" % (" ".join(cmd), host, r.stderr.strip())


def heal(job, f):
    """Ends a partition or link loss: removes its iptables rules. Returns None or why not."""
    errs = [e for e in (_host_sh(job, f["host"], ["iptables", "-D"] + rule) for rule in f.get("rules", [])) if e]
    f["healed_ns"] = now_ns()
    return "; ".join(errs) or None


def corrupt_newest(ckpt, rng, how):
    """Damages the newest committed checkpoint: flips one bit inside a tensor's bytes, or
    truncates the file that holds a tensor to end inside its bytes. Returns (step, what)
    or (None, why)."""
    steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))
    if not steps:
        return None, "no committed checkpoint to damage"
    d = os.path.join(ckpt, steps[-1])
    tensors = _walk_links(d)
    if not tensors:
        return None, "no tensor found in %s" % d
    name, path, off, size = rng.choice(tensors)
    step = int(steps[-1][5:])
    if how == "bitflip":
        pos, bit = off + rng.randrange(size), rng.randrange(8)
        with open(path, "r+b") as fh:
            fh.seek(pos)
            b = fh.read(1)
            fh.seek(pos)
            fh.write(bytes([b[0] ^ (1 << bit)]))
            fh.flush()
            os.fsync(fh.fileno())
        return step, "bit %d of byte %d of %s (tensor %s)" % (bit, pos, os.path.relpath(path, ckpt), name)
    cut = off + rng.randrange(size)
    os.truncate(path, cut)
    return step, "%s truncated to %d bytes (inside tensor %s)" % (os.path.relpath(path, ckpt), cut, name)


def _walk_links(d):
    """(name, file, offset, bytes) of every tensor of index.h5, following external links."""
    import h5py  # Debian's python3-h5py
    out = []
    with h5py.File(os.path.join(d, "index.h5"), "r") as idx:
        def walk(g, prefix):
            for key in g:
                obj = g[key]
                if isinstance(obj, h5py.Group):
                    walk(obj, prefix + key + "/")
                elif obj.id.get_offset() is not None and obj.id.get_storage_size() > 0:
                    out.append((prefix + key, os.path.join(d, os.path.basename(obj.file.filename)),
                                obj.id.get_offset(), obj.id.get_storage_size()))
        walk(idx, "")
    return out
