/*
 * tools/run_grow.c - an elastic `rekindle run` (--host-discovery-script): the size of each
 * launch from the discovered hosts, and the watch over a running job that decides when it
 * grows (docs/LAUNCHER.md, "Elastic jobs").
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "run.h"
#include "tools.h"

/* One look, every tick of run_mpirun: losses cool their hosts; the script runs every
   interval (or at once when RK_RUN_DIR/grow appears); when more slots are free than
   workers are alive, growth is decided, and once a checkpoint newer than the one then
   committed is on disk, returns true: stop the job, launch it again on every slot. */
bool grow_tick(struct grow *g)
{
    struct elastic *el = g->el;
    int64_t now = rk__mono_ns();
    for (int r = 0; r < g->workers; r++) {
        char kind[16], host[64], beat_host[64], addrs[512], as[ELASTIC_HOST_LEN];
        int code = 0;
        if (g->seen[r])
            continue;
        if (!rec_read_end(g->rec, r, kind, &code, host)) {
            /* No record, and its wrapper's beat stopped (by this launcher's clock: records.c,
               R3): gone with its host (or the wrapper killed with it). */
            int64_t beat = rec_beat_seen(g->rec, r);
            if (!beat || now - beat < (int64_t)LOST_BEATS * BEAT_MS * 1000000)
                continue;
        } else if (strcmp(kind, "exit") == 0 && code == 0) {
            g->seen[r] = true;
            continue;
        }
        g->seen[r] = true;
        g->alive--;
        /* The host as the beat names it, with its addresses, matched to the script's names. */
        if (rec_beat_host(g->rec, r, beat_host, addrs, sizeof(addrs)) && !host[0])
            snprintf(host, sizeof(host), "%s", beat_host);
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
    int64_t newest = -1;
    if (g->base == -2) {
        int free = elastic_slots(el, now), want = free < g->a->max_np ? free : g->a->max_np;
        if (want <= g->alive || g->alive <= 0)
            return false;
        if (!g->ckpt_dir) {
            if (!g->warned_no_ckpt)
                fprintf(stderr, "rekindle: run: %d slots are free for %d workers, but a job grows from its next "
                                "checkpoint: set RK_CKPT_DIR\n", free, g->alive);
            g->warned_no_ckpt = true;
            return false;
        }
        ckpt_newest_below(g->ckpt_dir, INT64_MAX, &newest);
        g->base = newest;
        g->target = want;
        fprintf(stderr, "rekindle: run: %d slots free for %d workers: growing to %d at the next checkpoint (after "
                        "step %lld)\n", free, g->alive, want, (long long)newest);
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
