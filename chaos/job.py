"""chaos/job.py - one real training job under `rekindle run`, watched and signalled.

A Job starts `rekindle run -n W [--max-restarts R] -- chaos/worker.sh rk-train ARGS` in its
own session, with every process of the run marked by the environment variable
CHAOS_RUN=<run id> (inherited by the launcher, mpirun, the worker wrappers and the
trainers). The mark is how the harness finds the run's processes in /proc, signals the
workers it chose, and proves afterwards that none was left behind.

While it runs, poll() reads what the job wrote so far: rank 0's 'step S ...' lines, every
rank's 'final step=N world=W hash=H' line (by launch attempt: the wrapper's
'chaos-attempt N' line comes first in each), and the event log (RK_EVENT_LOG=<dir>/ev,
one file per rank at start: ev.<rank>).
"""
import json
import os
import re
import signal
import subprocess
import time

STEP_RE = re.compile(r"^step (\d+) loss \S+ world (\d+)")
FINAL_RE = re.compile(r"^final step=(\d+) world=(\d+) hash=([0-9a-f]{16})")
ATTEMPT_RE = re.compile(r"^chaos-attempt (\d+)$")  # chaos/worker.sh, rank 0, before the trainer


# Open MPI as root, in a container (no CMA), more processes than cores.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def now_ns():
    return time.time_ns()  # CLOCK_REALTIME, the event log's clock


def marked_processes(mark, exact=True):
    """{pid: (comm, env dict)} of the processes whose CHAOS_RUN is mark (or starts with
    it when exact is False). A process in the middle of its exec is not seen: its environ
    reads empty until the kernel has laid out the new one."""
    found = {}
    want = ("CHAOS_RUN=" + mark).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                raw = f.read()
            if want not in raw:
                continue
            env = dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)
            run = env.get(b"CHAOS_RUN", b"")
            if run != want[len("CHAOS_RUN="):] and (exact or not run.startswith(want[len("CHAOS_RUN="):])):
                continue
            with open("/proc/%s/comm" % d) as f:
                comm = f.read().strip()
            with open("/proc/%s/stat" % d) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue  # a zombie holds nothing; its parent reaps it
            found[int(d)] = (comm, {k.decode(errors="replace"): v.decode(errors="replace") for k, v in env.items()})
        except (OSError, ValueError):
            continue
    return found


class Hosts:
    """K hosts made by scripts/hosts (network namespaces on a bridge) for a campaign:
    up() makes them and a hostfile, down() removes them (idempotent); env is what a job
    needs to run on them (rsh agent, TCP transport on the bridge's subnet, the
    detector's subnet)."""

    def __init__(self, src, k, slots, workdir, prefix="rkc", net="10.78.0"):
        self.script = os.path.join(src, "scripts", "hosts")
        self.k, self.slots = k, slots
        self.names = ["%s%d" % (prefix, i) for i in range(1, k + 1)]
        self.net = net
        self.hostfile = os.path.join(workdir, "hostfile")
        self.senv = dict(os.environ, RK_HOSTS_PREFIX=prefix, RK_HOSTS_NET=net)
        subnet = net + ".0/24"
        self.env = {"OMPI_MCA_plm_rsh_agent": self.script + " agent", "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
                    "OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": subnet,
                    "OMPI_MCA_oob_tcp_if_include": subnet, "RK_DET_IFACE": subnet,
                    "RK_HOSTS_PREFIX": prefix, "RK_HOSTS_NET": net,
                    # The hosts share this machine's cores, but each sees them all as its own:
                    # Open MPI, which yields in its waits only on a host it knows to be
                    # oversubscribed, would spin in every one (a join's thread left inside
                    # MPI_Comm_spawn spun beside the trainers for the rest of the job and
                    # slowed their steps 5-20x: docs/CHAOS.md). Separate machines would not
                    # share those cores.
                    "OMPI_MCA_mpi_yield_when_idle": "1"}
        self._ino = {}

    def check(self):
        r = subprocess.run([self.script, "check"], env=self.senv, capture_output=True, text=True)
        return None if r.returncode == 0 else (r.stdout + r.stderr).strip() or "scripts/hosts check failed"

    def up(self):
        r = subprocess.run([self.script, "up", str(self.k), self.hostfile, str(self.slots)], env=self.senv,
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            return (r.stdout + r.stderr).strip()
        self._ino = {os.stat("/run/netns/" + h).st_ino: h for h in self.names}
        return None

    def down(self):
        subprocess.run([self.script, "down"], env=self.senv, capture_output=True, timeout=60)

    def host_of(self, pid):
        try:
            return self._ino.get(os.stat("/proc/%d/ns/net" % pid).st_ino)
        except OSError:
            return None

    def ns(self, host):
        """The command prefix that runs a command inside host's network namespace."""
        return ["ip", "netns", "exec", host]


def kill_marked(mark, exact=True, sig=signal.SIGKILL):
    """Signals every process of the mark (SIGCONT after SIGKILL is not needed: a stopped
    process dies of SIGKILL). Returns the pids signalled."""
    pids = list(marked_processes(mark, exact))
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    return pids


class Job:
    def __init__(self, run_dir, build, src, workers, train_args, env, mark, max_restarts=0, netns=False, hosts=None,
                 elastic=None, spares=0):
        self.dir = run_dir
        self.build, self.src = build, src
        self.workers = workers
        self.train_args = list(train_args)
        self.env = dict(env)
        self.mark = mark
        self.max_restarts = max_restarts
        self.netns = netns
        self.hosts = hosts        # Hosts (scripts/hosts) to run on, or None: this host
        # Elastic (a dict: cooldown_s, unlisted): `rekindle run --host-discovery-script`
        # reading the list of the hosts up, which the harness changes (list_host).
        self.elastic = elastic
        self.spares = spares      # held back at launch (--spares): ranks workers.. of the launch
        self.listed = set()
        self.hosts_list = os.path.join(run_dir, "hosts-up")
        if elastic:
            for i, h in enumerate(hosts.names):
                if i != elastic.get("unlisted"):
                    self.list_host(h, True)
        self.ckpt = os.path.join(run_dir, "ckpt")
        self.evbase = os.path.join(run_dir, "ev")
        self.launch_dir = os.path.join(run_dir, "launch")
        os.makedirs(self.ckpt, exist_ok=True)
        os.makedirs(self.launch_dir, exist_ok=True)
        self.proc = None
        self.phase = -1           # harness launches so far - 1
        self.rcs = []             # exit status of each harness launch
        self.last_step = -1       # highest 'step S' printed by rank 0 in any phase
        self.step_seen_ns = {}    # step -> when the harness first saw it
        self.finals = []          # (phase, step, world, hash, launch attempt of `rekindle run`)
        self.attempt = 0          # the current phase's latest attempt (its 'chaos-attempt N' line)
        self.events = []          # every event line parsed, with "_rank_file"
        self.bad_event_lines = [] # lines that are not one JSON object
        self._ev_off = {}
        self._ev_part = {}
        self._out_off = 0
        self._out_part = ""

    # ---- launching -----------------------------------------------------------------
    def slots(self, host):
        """An elastic job's slots on host: the workers spread over the hosts, the first
        ones taking one more where they do not divide."""
        i, k = self.hosts.names.index(host), len(self.hosts.names)
        return self.workers // k + (1 if i < self.workers % k else 0)

    def list_host(self, host, up):
        """Lists host (up) or takes it off the list the discovery script prints (replaced
        whole, by a rename: the launcher never reads half of it)."""
        (self.listed.add if up else self.listed.discard)(host)
        tmp = self.hosts_list + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join("%s:%d\n" % (h, self.slots(h)) for h in self.hosts.names if h in self.listed))
        os.rename(tmp, self.hosts_list)

    def run_dir(self):
        return os.path.join(self.launch_dir, "phase-%d" % self.phase)

    def start_world(self):
        return sum(self.slots(h) for h in self.listed) if self.elastic else self.workers

    def command(self):
        cmd = [os.path.join(self.build, "bin", "rekindle"), "run"]
        if self.elastic:
            cmd += ["--host-discovery-script", "cat " + self.hosts_list, "--discovery-interval", "0.2",
                    "--blacklist-cooldown", "%g" % self.elastic["cooldown_s"], "--max-np", str(self.workers)]
        else:
            cmd += ["-n", str(self.workers)] + (["--hostfile", self.hosts.hostfile] if self.hosts else [])
        if self.spares:
            cmd += ["--spares", str(self.spares)]
        if self.max_restarts:
            cmd += ["--max-restarts", str(self.max_restarts)]
        cmd += ["--", os.path.join(self.src, "chaos", "worker.sh"),
                os.path.join(self.build, "bin", "rk-train")] + self.train_args
        if self.netns:
            # A private network namespace: its loopback (and any netem on it) is the run's own.
            cmd = ["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] + cmd
        return cmd

    def start(self):
        self.phase += 1
        env = dict(os.environ)
        env.update(self.env)
        env.update({
            "CHAOS_RUN": self.mark,
            "RK_CKPT_DIR": self.ckpt,
            "RK_EVENT_LOG": self.evbase,
            "RK_RUN_DIR": self.run_dir(),
        })
        env.update(MPI_ENV)
        if self.hosts:
            env.update(self.hosts.env)
        # The launcher refuses a records directory open to group or other writes
        # (docs/LAUNCHER.md): 0700 whatever the umask.
        os.makedirs(env["RK_RUN_DIR"], mode=0o700, exist_ok=True)
        os.chmod(env["RK_RUN_DIR"], 0o700)
        self._out_off, self._out_part = 0, ""
        self.attempt = 0
        self.out_path = os.path.join(self.dir, "stdout.%d" % self.phase)
        self.err_path = os.path.join(self.dir, "stderr.%d" % self.phase)
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.start_ns = now_ns()

    def running(self):
        if self.proc is None:
            return False
        rc = self.proc.poll()
        if rc is None:
            return True
        if len(self.rcs) <= self.phase:
            self.rcs.append(rc)
        return False

    def relaunches(self):
        """Launches `rekindle run` made by itself in every phase (attempt-1, ...)."""
        n = 0
        for p in range(self.phase + 1):
            d = os.path.join(self.launch_dir, "phase-%d" % p)
            n += len([a for a in os.listdir(d) if a.startswith("attempt-") and a != "attempt-0"]) if os.path.isdir(d) else 0
        return n

    def stderr_text(self):
        text = ""
        for p in range(self.phase + 1):
            try:
                with open(os.path.join(self.dir, "stderr.%d" % p), errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
        return text

    # ---- watching ------------------------------------------------------------------
    def poll(self):
        try:
            with open(self.out_path, "rb") as f:
                f.seek(self._out_off)
                data = f.read()
        except OSError:
            data = b""
        self._out_off += len(data)
        text = self._out_part + data.decode(errors="replace")
        lines = text.split("\n")
        self._out_part = lines.pop()
        for ln in lines:
            m = STEP_RE.match(ln)
            if m:
                s = int(m.group(1))
                self.step_seen_ns.setdefault(s, now_ns())
                self.last_step = max(self.last_step, s)
                continue
            m = FINAL_RE.match(ln)
            if m:
                self.finals.append((self.phase, int(m.group(1)), int(m.group(2)), m.group(3), self.attempt))
                continue
            m = ATTEMPT_RE.match(ln)
            if m:
                self.attempt = max(self.attempt, int(m.group(1)))
        self._poll_events()

    def _poll_events(self):
        base = os.path.basename(self.evbase) + "."
        for name in os.listdir(self.dir):
            if not name.startswith(base) or not name[len(base):].isdigit():
                continue
            path = os.path.join(self.dir, name)
            off = self._ev_off.get(name, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(off)
                    data = f.read()
            except OSError:
                continue
            self._ev_off[name] = off + len(data)
            text = self._ev_part.get(name, "") + data.decode(errors="replace")
            lines = text.split("\n")
            self._ev_part[name] = lines.pop()
            for ln in lines:
                try:
                    ev = json.loads(ln)
                    if not isinstance(ev, dict) or not {"t_ns", "rank", "event"} <= ev.keys():
                        raise ValueError("missing t_ns/rank/event")
                except ValueError:
                    self.bad_event_lines.append("%s: %r" % (name, ln[:200]))
                    continue
                ev["_file_rank"] = int(name[len(base):])
                self.events.append(ev)

    def events_named(self, name, after_ns=0):
        return [e for e in self.events if e["event"] == name and e["t_ns"] >= after_ns]

    def live_workers(self):
        """{rank at start (a worker started later: its slot): pid} of the trainers of the
        newest launch attempt still alive."""
        procs = marked_processes(self.mark)
        by_attempt = {}
        for pid, (comm, env) in procs.items():
            if comm != "rk-train" or "OMPI_COMM_WORLD_RANK" not in env:
                continue
            key = (env.get("RK_RUN_DIR", ""), int(env.get("RK_RUN_ATTEMPT", "0")))
            # a worker started while the job runs (a growth in place) is rank 0 of its own
            # MPI_COMM_WORLD: its slot in the job is RK_RUN_SLOT (tools/run_worker.c)
            by_attempt.setdefault(key, {})[int(env.get("RK_RUN_SLOT", env["OMPI_COMM_WORLD_RANK"]))] = pid
        if not by_attempt:
            return {}
        return by_attempt[max(by_attempt)]

    def host_of(self, pid):
        """The host (scripts/hosts) process pid runs on, or None."""
        return self.hosts.host_of(pid) if self.hosts else None

    def kill_everything(self):
        """SIGKILL every process of the run, the launcher included; waits until they are
        gone (bounded). Returns the pids it had to signal."""
        pids = kill_marked(self.mark)
        deadline = time.monotonic() + 10
        while marked_processes(self.mark) and time.monotonic() < deadline:
            kill_marked(self.mark)
            time.sleep(0.05)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.running()
        return pids
