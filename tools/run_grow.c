/*
 * tools/run_grow.c - a job's growth while it runs (docs/LAUNCHER.md, "Elastic jobs" and
 * "Growing in place"): an elastic `rekindle run` (--host-discovery-script) sizes each launch
 * from the discovered hosts and grows by a relaunch at a checkpoint (grow_tick); a run with
 * spares held back at launch (--spares S) grows when RK_RUN_DIR/grow asks, in place onto the
 * spares still waiting (grow_spares_tick: the workers keep their processes), or, with
 * --grow relaunch or no spare waiting, by the same relaunch, the held-back slots then
 * started as workers. Either way the launcher says which way the growth went.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "run.h"
#include "tools.h"

/* A slot alive by the launcher's count: a worker of the launch until its end was taken, a
   worker started since from its join to its end. */
static bool slot_alive(const struct grow *g, int r)
{
    return r < g->workers ? g->seen[r] != SLOT_ENDED : g->seen[r] == SLOT_JOINED;
}

static bool relaunch_tick(struct grow *g, int want, const char *why);
static bool join_start(struct grow *g, int64_t now, int free, int want);
static bool join_tick(struct grow *g, int64_t now);
static bool joined(const struct grow *g, int r);
static bool ended(const struct grow *g, int r);

/* One look, every tick of run_mpirun: losses cool their hosts; the script runs every
   interval (or at once when RK_RUN_DIR/grow appears); when more slots are free than
   workers are alive, growth is decided, and once a checkpoint newer than the one then
   committed is on disk, returns true: stop the job, launch it again on every slot. */
bool grow_tick(struct grow *g)
{
    struct elastic *el = g->el;
    int64_t now = rk__mono_ns();
    for (int r = 0; r < g->workers + (g->joins ? RK_JOIN_SLOTS : 0); r++) {
        char kind[16], host[64], beat_host[64], addrs[512], as[ELASTIC_HOST_LEN];
        int code = 0;
        if (r >= g->workers && g->seen[r] == SLOT_UNSEEN) { /* a worker started since: counted once it joined */
            if (!joined(g, r))
                continue;
            g->seen[r] = SLOT_JOINED;
            g->alive++;
        }
        if (g->seen[r] == SLOT_ENDED)
            continue;
        bool whole = false;
        if (!rec_read_end(g->rec, r, kind, &code, host)) {
            /* No record, and its wrapper's beat stopped (by this launcher's clock: records.c,
               R3): gone with its host (or the wrapper killed with it). */
            int64_t beat = rec_beat_seen(g->rec, r);
            if (!beat || now - beat < (int64_t)LOST_BEATS * BEAT_MS * 1000000)
                continue;
            whole = true;
        } else if (strcmp(kind, "exit") == 0 && code == 0) {
            g->seen[r] = SLOT_ENDED;
            g->completing = true;
            continue;
        }
        g->seen[r] = SLOT_ENDED;
        g->alive--;
        /* The host as the beat names it, with its addresses, matched to the script's names. */
        if (rec_beat_host(g->rec, r, beat_host, addrs, sizeof(addrs)) && !host[0])
            snprintf(host, sizeof(host), "%s", beat_host);
        int idx;
        if (whole && host[0] && elastic_match(el, host, addrs, &idx, 1)) /* mpirun's daemon there went too */
            el->hosts[idx].unreachable = true;
        if (host[0] && elastic_cool(el, host, addrs, now, as, sizeof(as)) > 0)
            fprintf(stderr, "rekindle: run: host %s%s%s%s lost worker %d: no growth onto it for %g s\n", host,
                    strcmp(as, host) ? " (listed as " : "", strcmp(as, host) ? as : "", strcmp(as, host) ? ")" : "",
                    r, g->a->cooldown_s);
    }
    bool now_asked = rec_take(g->run, "grow");
    if (now_asked || now >= el->next_ns) {
        el->next_ns = now + (int64_t)(g->a->interval_s * 1e9);
        if (elastic_discover(el) != 0) {
            if (strcmp(el->error, g->last_error) != 0)
                fprintf(stderr, "rekindle: run: host discovery: %s (the hosts known stay as they were)\n", el->error);
            snprintf(g->last_error, sizeof(g->last_error), "%s", el->error);
        } else {
            g->last_error[0] = '\0';
        }
    }
    int free = elastic_slots(el, now), want = free < g->a->max_np ? free : g->a->max_np;
    if (g->ip_target > 0)
        return join_tick(g, now);
    /* A completed worker's slot is free, but the job is ending: growing onto it would start
       a worker (or a relaunch) for nothing. */
    if (g->base == -2 && (want <= g->alive || g->alive <= 0 || g->completing))
        return false;
    if (g->base == -2 && !g->a->grow_relaunch && !g->ip_failed && join_start(g, now, free, want))
        return false;
    if (g->base == -2 && !g->ckpt_dir) {
        if (!g->warned_no_ckpt)
            fprintf(stderr, "rekindle: run: %d slots are free for %d workers, but a job grows from its next "
                            "checkpoint: set RK_CKPT_DIR\n", free, g->alive);
        g->warned_no_ckpt = true;
        return false;
    }
    char why[96];
    snprintf(why, sizeof(why), "%d slots free for %d workers", free, g->alive);
    return relaunch_tick(g, want, why);
}

/* The growth by a relaunch: decided (base -2) with the newest commit then, and once a
   checkpoint newer than it is committed, the stop file is written and true returned: stop
   the job, launch it again on `want` workers. */
static bool relaunch_tick(struct grow *g, int want, const char *why)
{
    int64_t newest = -1;
    if (g->base == -2) {
        if (!g->ckpt_dir) {
            fprintf(stderr, "rekindle: run: %s, but a job grows by a relaunch from its next checkpoint: set "
                            "RK_CKPT_DIR (not grown)\n", why);
            return false;
        }
        ckpt_newest_below(g->ckpt_dir, INT64_MAX, &newest);
        g->base = newest;
        g->target = want;
        fprintf(stderr, "rekindle: run: %s: growing to %d at the next checkpoint (after step %lld)\n", why, want,
                (long long)newest);
        return false;
    }
    if (ckpt_newest_below(g->ckpt_dir, INT64_MAX, &newest) != 0 || newest <= g->base)
        return false;
    fprintf(stderr, "rekindle: run: checkpoint %lld committed: stopping the job to launch it again on %d workers\n",
            (long long)newest, g->target);
    g->regrow = true;
    /* Each worker's wrapper ends its program when it sees the file. Not made (a full
       disk): the caller's SIGTERM to mpirun stops the job all the same, slower. */
    rec_touch(g->rec, RUN_STOP_FILE);
    return true;
}

/* ---- growth in place onto spares held back at launch ------------------------------------ */

/* Worker r's state by its records: ended (a record of its end), joined (a spare that a
   recovery brought in: joined-<r>, by the library). */
static bool ended(const struct grow *g, int r)
{
    char kind[16], host[64];
    int code = 0;
    return rec_read_end(g->rec, r, kind, &code, host);
}

static bool joined(const struct grow *g, int r)
{
    char name[32];
    snprintf(name, sizeof(name), "joined-%d", r);
    return rec_exists(g->rec, name);
}

/* Members alive (workers and joined spares without a record of their end), spares waiting
   (neither joined nor ended) and spares joined, of this attempt. */
static void census(const struct grow *g, int *alive, int *waiting, int *in)
{
    *alive = *waiting = *in = 0;
    for (int r = 0; r < g->a->n + g->a->spares; r++) {
        bool spare = r >= g->a->n, j = spare && joined(g, r), e = ended(g, r);
        *alive += (!spare || j) && !e;
        *waiting += spare && !j && !e;
        *in += j;
    }
}

/* RK_RUN_DIR/grow, taken: the workers to add it asks for (its content, default 1), 0 with
   none. Read relative to the directory, never through a link (records.c R1). */
static int grow_request(const struct grow *g)
{
    int fd = openat(g->run->fd, "grow", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char buf[32] = "";
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    rec_take(g->run, "grow");
    buf[n > 0 ? n : 0] = '\0';
    char *end = NULL;
    long k = strtol(buf, &end, 10);
    if (end == buf)
        return 1; /* empty (touched): one more */
    if (k < 1 || k > 1 << 16 || (*end && *end != '\n')) {
        fprintf(stderr, "rekindle: run: RK_RUN_DIR/grow says '%.*s': want the count of workers to add (or "
                        "nothing: 1); ignored\n", (int)strcspn(buf, "\n"), buf);
        return 0;
    }
    return (int)k;
}

/* The world the workers grow to, in the attempt's grow-to (recover/recovery.c G2): written
   whole under another name, then renamed over the last. */
static int write_target_text(const struct grow *g, const char *text)
{
    unlinkat(g->rec->fd, ".grow-to", 0);
    FILE *f = rec_create_file(g->rec, ".grow-to");
    if (!f)
        return -errno;
    bool ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    if (!ok || renameat(g->rec->fd, ".grow-to", g->rec->fd, "grow-to") != 0)
        return -(errno ? errno : EIO);
    return 0;
}

static int write_target(const struct grow *g, int world)
{
    char text[32];
    snprintf(text, sizeof(text), "%d\n", world);
    return write_target_text(g, text);
}

/* The bound on a growth in place: the survivors' recovery rounds (3 of RK_TIMEOUT_MS, as
   the workers read it: the options' table, its default where unset or refused), for a
   worker started meanwhile its join before them (the members give one up at 2 x 2 of
   RK_TIMEOUT_MS: recover/join_proto.c J14), and a few seconds for the notes. */
static int64_t in_place_bound_ns(bool join)
{
    rk_options o;
    rk_options_init(&o);
    return ((int64_t)o.timeout_ms * (join ? 3 + 4 : 3) + 5000) * 1000000LL;
}

bool grow_spares_tick(struct grow *g)
{
    int64_t now = rk__mono_ns();
    int alive, waiting, in;
    if (g->base != -2)
        return relaunch_tick(g, g->target, "");
    if (g->ip_target > 0) { /* a growth in place under way */
        census(g, &alive, &waiting, &in);
        if (in - g->ip_joined >= g->ip_target - g->ip_from) {
            fprintf(stderr, "rekindle: run: grown in place to %d workers in %.0f ms: %d spare(s) joined, no worker "
                            "restarted\n", g->ip_target, (double)(now - g->ip_since) / 1e6, in - g->ip_joined);
            g->ip_target = 0;
        } else if (waiting == 0 || now - g->ip_since > in_place_bound_ns(false)) {
            fprintf(stderr, "rekindle: run: growth in place to %d workers did not complete (%s): the job goes on at "
                            "%d workers\n", g->ip_target,
                    waiting == 0 ? "no spare left waiting: the ones asked ended" : "not within its bound", alive);
            write_target(g, alive); /* asks nothing more of the workers */
            g->ip_target = 0;
        }
        return false;
    }
    int k = grow_request(g);
    if (k <= 0)
        return false;
    census(g, &alive, &waiting, &in);
    int slots = g->a->n + g->a->spares; /* a relaunch starts the held-back slots as workers */
    if (!g->a->grow_relaunch && waiting > 0) {
        int add = k < waiting ? k : waiting, rc = write_target(g, alive + add);
        if (rc == 0) {
            fprintf(stderr, "rekindle: run: growing in place from %d to %d workers onto %d spare(s) held back at "
                            "launch\n", alive, alive + add, add);
            g->ip_target = alive + add;
            g->ip_from = alive;
            g->ip_joined = in;
            g->ip_since = now;
            return false;
        }
        fprintf(stderr, "rekindle: run: growth in place: cannot write %s/grow-to: %s: growing by a relaunch\n",
                g->rec->path, strerror(-rc));
    }
    int want = alive + k < slots ? alive + k : slots;
    char why[96];
    snprintf(why, sizeof(why), "%d workers asked for %d more (%s)", alive, k,
             g->a->grow_relaunch ? "--grow relaunch" : "no spare waiting to grow in place");
    if (want <= alive) {
        fprintf(stderr, "rekindle: run: %s, but every one of the %d slots is in use: not grown\n", why, slots);
        return false;
    }
    return relaunch_tick(g, want, why);
}

/* ---- growth in place by workers started while the job trains (elastic) ------------------ */

/* Where the newcomers go: the free slots of the listed hosts not cooling down, in the
   script's order, once the slots of the workers alive (their beats' hosts) are taken
   away, on the hosts mpirun was launched with (its allocation) and not lost whole since.
   Open MPI 4.1.4 spawns onto those alone: onto a host lost whole (its daemon went with it)
   mpirun ended the job's workers, and onto a host it must add ("add-host") it aborted the
   job (measured 2026-11-28, namespace hosts); a growth onto such a host goes by a
   relaunch. Writes the grow file's join lines into text (cap) and the hosts into
   g->ip_hosts; how many. */
static int join_hosts(struct grow *g, int64_t now, int k, char *text, size_t cap)
{
    struct elastic *el = g->el;
    int used[ELASTIC_MAX_HOSTS] = {0}, n = 0;
    for (int r = 0; r < g->workers + (g->joins ? RK_JOIN_SLOTS : 0); r++) {
        char host[64] = "", addrs[512] = "";
        int idx;
        if (slot_alive(g, r) && rec_beat_host(g->rec, r, host, addrs, sizeof(addrs)) && elastic_match(el, host, addrs, &idx, 1))
            used[idx]++;
    }
    size_t len = strlen(text), hl = 0;
    g->ip_hosts[0] = '\0';
    for (int i = 0; i < el->nhosts && n < k; i++) {
        const struct elastic_host *h = &el->hosts[i];
        bool reach = h->listed && h->launched && !h->unreachable && h->cool_until_ns <= now;
        for (int s = used[i]; reach && s < h->slots && n < k; s++, n++) {
            len += (size_t)snprintf(text + len, len < cap ? cap - len : 0, "join %s\n", h->name);
            hl += (size_t)snprintf(g->ip_hosts + hl, hl < sizeof(g->ip_hosts) ? sizeof(g->ip_hosts) - hl : 0,
                                   "%s%s", n ? ", " : "", h->name);
        }
    }
    return len < cap ? n : 0;
}

enum { JOIN_TRIES = 3 }; /* workers started for one growth in place, then a relaunch */

/* Workers started since the launch that ended without having joined. */
static int ended_unjoined(const struct grow *g)
{
    int n = 0;
    for (int r = g->workers; r < g->workers + RK_JOIN_SLOTS; r++)
        n += g->seen[r] == SLOT_UNSEEN && ended(g, r);
    return n;
}

/* Workers started since the launch that joined (whether or not they ended since: such a
   slot is ENDED only after JOINED, grow_tick): the launcher's count of a growth's
   newcomers, not the members alive (a member lost meanwhile is no newcomer less). */
static int joined_since_launch(const struct grow *g)
{
    int n = 0;
    for (int r = g->workers; r < g->workers + RK_JOIN_SLOTS; r++)
        n += g->seen[r] != SLOT_UNSEEN;
    return n;
}

/* An elastic run with more free slots than workers alive grows in place first: the grow
   file asks the workers for the world wanted, with a join line per worker to start
   (recover/join_proto.c J16), and the launcher follows the newcomers' joined notes.
   False when it cannot ask (the growth then goes by a relaunch). */
static bool join_start(struct grow *g, int64_t now, int free, int want)
{
    char text[8192];
    snprintf(text, sizeof(text), "%d\n", want);
    int k = join_hosts(g, now, want - g->alive, text, sizeof(text)), rc = k > 0 ? write_target_text(g, text) : -ENOSPC;
    if (rc != 0) {
        fprintf(stderr, "rekindle: run: growth in place: cannot ask the workers (%s): growing by a relaunch\n",
                k > 0 ? strerror(-rc) : "no free slot on a listed host that mpirun still reaches");
        g->ip_failed = true;
        return false;
    }
    fprintf(stderr, "rekindle: run: %d slots free for %d workers: growing in place to %d, %d worker(s) started on %s "
                    "while the job trains\n", free, g->alive, g->alive + k, k, g->ip_hosts);
    g->joins = true;
    g->ip_unjoined = ended_unjoined(g);
    g->ip_joined = joined_since_launch(g);
    g->ip_target = g->alive + k;
    g->ip_from = g->alive;
    g->ip_since = now;
    return true;
}

/* A growth in place under way: done once as many workers are alive as asked; not done
   within its bound, the workers are asked for the world there is and the growth goes by a
   relaunch. */
static bool join_tick(struct grow *g, int64_t now)
{
    if (g->alive >= g->ip_target) {
        fprintf(stderr, "rekindle: run: grown in place to %d workers in %.0f ms: %d started on %s joined, no worker "
                        "restarted\n", g->alive, (double)(now - g->ip_since) / 1e6, joined_since_launch(g) - g->ip_joined,
                g->ip_hosts);
        g->ip_target = 0;
        return false;
    }
    /* J19: the workers' spawn failed with the newcomer alive (slower to reach MPI_Init than
       the spawn allows): another would fail alike, so the growth goes by a relaunch now. */
    char why[640] = "";
    for (int r = g->workers; r < g->workers + RK_JOIN_SLOTS && !why[0]; r++) {
        char name[32], text[512];
        snprintf(name, sizeof(name), "unjoined-%d", r);
        if (rec_take_text(g->rec, name, text, sizeof(text)))
            snprintf(why, sizeof(why), "the workers gave the join up: %s", text[0] ? text : "no reason given");
    }
    int64_t bound = in_place_bound_ns(true) * (g->ip_target - g->ip_from);
    int unjoined = ended_unjoined(g);
    bool lost = unjoined > g->ip_unjoined; /* a newcomer ended before it joined */
    if (lost && ++g->ip_tries < JOIN_TRIES) {
        /* The workers went on without it; the request stands, and they start another once
           the join given up on is over (recover/join_proto.c J17). */
        fprintf(stderr, "rekindle: run: a worker started to grow in place ended before it joined: the workers start "
                        "another (try %d of %d)\n", g->ip_tries + 1, JOIN_TRIES);
        g->ip_unjoined = unjoined;
        g->ip_since = now;
        return false;
    }
    if (g->alive > 0 && now - g->ip_since <= bound && !lost && !why[0])
        return false;
    if (!why[0])
        snprintf(why, sizeof(why), lost ? "a worker started for it ended before it joined" : "not within %.0f s",
                 (double)bound / 1e9);
    fprintf(stderr, "rekindle: run: growth in place to %d workers did not complete (%s; %d of %d joined): growing by a "
                    "relaunch\n", g->ip_target, why, joined_since_launch(g) - g->ip_joined, g->ip_target - g->ip_from);
    write_target(g, g->alive); /* asks nothing more of the workers */
    g->ip_target = 0;
    g->ip_failed = true;
    return false;
}

/* Before each launch of an elastic run: the hosts from the script, waiting (at most
   --elastic-timeout, the script run every --discovery-interval) until --min-np slots are
   free; the launch gets every free slot up to --max-np (the first launch at most -n) and
   a hostfile RUN_DIR/hostfile-K. 0, the launcher's exit status on a timeout, or
   128+signal when stopped meanwhile. */
int elastic_size(struct run_args *a, struct elastic *el, int first_n, const struct records *run, int k,
                 const sigset_t *watch, char *hostfile, size_t cap)
{
    int64_t deadline = rk__deadline_ns((int64_t)(a->elastic_timeout_s * 1000)), next_say = 0;
    int free = 0;
    for (;;) {
        int64_t now = rk__mono_ns();
        if (elastic_discover(el) != 0)
            fprintf(stderr, "rekindle: run: host discovery: %s\n", el->error);
        free = elastic_slots(el, now);
        if (free >= a->min_np)
            break;
        if (now >= deadline)
            return tool_error(TOOL_USAGE, "run: %d free slots of the --min-np %d after --elastic-timeout %g s", free,
                              a->min_np, a->elastic_timeout_s);
        if (now >= next_say) {
            fprintf(stderr, "rekindle: run: waiting for --min-np %d slots (%d free now)\n", a->min_np, free);
            next_say = now + 10 * 1000000000LL;
        }
        struct timespec tick = {(time_t)a->interval_s, (long)((a->interval_s - (double)(time_t)a->interval_s) * 1e9)};
        int sig = sigtimedwait(watch, NULL, &tick);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP)
            return 128 + sig;
    }
    int n = free < a->max_np ? free : a->max_np;
    if (k == 0 && first_n > 0 && first_n < n)
        n = first_n;
    char name[32];
    snprintf(name, sizeof(name), "hostfile-%d", k);
    if (snprintf(hostfile, cap, "%s/%s", run->path, name) >= (int)cap)
        return tool_error(TOOL_USAGE, "run: the hostfile of launch %d: path too long", k);
    FILE *f = rec_create_file(run, name);
    if (!f)
        return tool_error(TOOL_USAGE, "run: the hostfile of launch %d: %s: %s", k, hostfile, strerror(errno));
    if (elastic_hostfile(el, f, hostfile, n, rk__mono_ns()) != 0)
        return tool_error(TOOL_USAGE, "run: the hostfile of launch %d: %s", k, el->error);
    a->n = n;
    a->hostfile = hostfile;
    el->next_ns = rk__mono_ns() + (int64_t)(a->interval_s * 1e9);
    fprintf(stderr, "rekindle: run: launching %d workers (%d free slots)\n", n, free);
    return 0;
}
