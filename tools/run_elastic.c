/*
 * tools/run_elastic.c - the hosts of an elastic `rekindle run` (run_elastic.h): the
 * discovery script's answer, parsed, and the hosts' cool-downs.
 */
#include "run_elastic.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "run.h"

enum {
    SCRIPT_TIMEOUT_MS = 10000, /* the script's bound, its exit included */
    GROUP_GRACE_MS = 500,      /* after SIGTERM of its group at the bound, before SIGKILL */
    WAIT_TICK_MS = 10,
    SCRIPT_OUT_MAX = 64 * 1024,
};

static struct elastic_host *find(struct elastic *e, const char *name)
{
    for (int i = 0; i < e->nhosts; i++)
        if (strcmp(e->hosts[i].name, name) == 0)
            return &e->hosts[i];
    return NULL;
}

int elastic_parse(struct elastic *e, const char *out)
{
    struct elastic_host *got = calloc(ELASTIC_MAX_HOSTS, sizeof(*got));
    int n = 0, line = 0, rc = -1;
    if (!got) {
        snprintf(e->error, sizeof(e->error), "out of memory");
        return -1;
    }
    for (const char *p = out; *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        line++;
        char buf[ELASTIC_HOST_LEN + 32];
        if (len >= sizeof(buf)) {
            snprintf(e->error, sizeof(e->error), "line %d of the discovery script's output is too long", line);
            goto out;
        }
        memcpy(buf, p, len);
        buf[len] = '\0';
        p += len + (end != NULL);
        char *s = buf;
        while (*s == ' ' || *s == '\t' || *s == '\r')
            s++;
        for (char *t = s + strlen(s); t > s && (t[-1] == ' ' || t[-1] == '\t' || t[-1] == '\r');)
            *--t = '\0';
        if (!*s || *s == '#')
            continue;
        long slots = 1;
        char *colon = strrchr(s, ':');
        if (colon) {
            char *tail = NULL;
            errno = 0;
            slots = strtol(colon + 1, &tail, 10);
            if (colon[1] == '\0' || *tail || errno || slots < 1 || slots > 65536) {
                snprintf(e->error, sizeof(e->error), "line %d '%.64s': want host or host:slots (slots 1..65536)",
                         line, s);
                goto out;
            }
            *colon = '\0';
        }
        if (!*s || strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != strlen(s)) {
            snprintf(e->error, sizeof(e->error), "line %d: '%.64s' is not a host name", line, s);
            goto out;
        }
        bool dup = false;
        for (int i = 0; i < n; i++)
            if (strcmp(got[i].name, s) == 0) {
                got[i].slots += (int)slots; /* a host named twice: its slots add up */
                dup = true;
            }
        if (dup)
            continue;
        if (n == ELASTIC_MAX_HOSTS) {
            snprintf(e->error, sizeof(e->error), "more than %d hosts", ELASTIC_MAX_HOSTS);
            goto out;
        }
        snprintf(got[n].name, sizeof(got[n].name), "%.*s", ELASTIC_HOST_LEN - 1, s);
        got[n].slots = (int)slots;
        n++;
    }
    /* Keep every known host (its cool-down), listed or not; new ones go at the end. */
    for (int i = 0; i < e->nhosts; i++)
        e->hosts[i].listed = false;
    for (int i = 0; i < n; i++) {
        struct elastic_host *h = find(e, got[i].name);
        if (!h) {
            if (e->nhosts == ELASTIC_MAX_HOSTS) {
                snprintf(e->error, sizeof(e->error), "more than %d hosts", ELASTIC_MAX_HOSTS);
                goto out;
            }
            h = &e->hosts[e->nhosts++];
            memcpy(h->name, got[i].name, sizeof(h->name));
            h->cool_until_ns = 0;
        }
        h->slots = got[i].slots;
        h->listed = true;
    }
    rc = 0;
out:
    free(got);
    return rc;
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The script's process group ended: SIGTERM, then SIGKILL after GROUP_GRACE_MS to what is
   left; the script reaped within a bound of its own. Whether it was reaped (*st). */
static bool end_group(pid_t pid, int *st)
{
    kill(-pid, SIGTERM);
    bool reaped = false;
    for (int64_t until = rk__deadline_ns(GROUP_GRACE_MS), hard = 0;;) {
        if (!reaped && waitpid(pid, st, WNOHANG) == pid)
            reaped = true;
        bool left = run_procs_signal(pid, false, 0) > 0;
        if (reaped && !left)
            return true;
        if (rk__mono_ns() >= until) {
            if (hard)
                return reaped; /* not even SIGKILL ended it (a process stuck in the kernel) */
            kill(-pid, SIGKILL);
            hard = 1;
            until = rk__deadline_ns(GROUP_GRACE_MS);
        }
        nap_ms(WAIT_TICK_MS);
    }
}

int elastic_discover(struct elastic *e)
{
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(e->error, sizeof(e->error), "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(e->error, sizeof(e->error), "fork: %s", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        execl("/bin/sh", "sh", "-c", e->script, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid); /* as the child does: the group exists whichever runs first */
    close(fd[1]);
    char *out = malloc(SCRIPT_OUT_MAX + 1);
    size_t got = 0;
    int64_t deadline = rk__deadline_ns(SCRIPT_TIMEOUT_MS);
    bool timed_out = false, too_long = false;
    while (out) {
        int left = (int)((deadline - rk__mono_ns()) / 1000000);
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd p = {.fd = fd[0], .events = POLLIN};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            timed_out = r == 0;
            break;
        }
        ssize_t k = read(fd[0], out + got, SCRIPT_OUT_MAX - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
        if (got == SCRIPT_OUT_MAX) {
            too_long = true;
            break;
        }
    }
    close(fd[0]);
    /* Its output read (or not), the script still has until the bound to exit: a script
       that closed its stdout and went on is ended with its group there (end_group). */
    int st = 0;
    bool exited = false;
    while (!exited && !timed_out && !too_long && out) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            exited = true;
        else if (w < 0 && errno != EINTR)
            break;
        else if (rk__mono_ns() >= deadline)
            timed_out = true;
        else
            nap_ms(WAIT_TICK_MS);
    }
    if (!exited && end_group(pid, &st))
        exited = true;
    int rc = -1;
    if (!out)
        snprintf(e->error, sizeof(e->error), "out of memory");
    else if (timed_out)
        snprintf(e->error, sizeof(e->error), "'%.120s' did not finish in %d s", e->script, SCRIPT_TIMEOUT_MS / 1000);
    else if (too_long)
        snprintf(e->error, sizeof(e->error), "'%.120s' printed more than %d bytes", e->script, SCRIPT_OUT_MAX);
    else if (!exited)
        snprintf(e->error, sizeof(e->error), "'%.120s' could not be waited for", e->script);
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        snprintf(e->error, sizeof(e->error), "'%.120s' failed (%s %d)", e->script,
                 WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    else {
        out[got] = '\0';
        rc = elastic_parse(e, out);
    }
    free(out);
    return rc;
}

int elastic_slots(const struct elastic *e, int64_t now_ns)
{
    int n = 0;
    for (int i = 0; i < e->nhosts; i++)
        if (e->hosts[i].listed && e->hosts[i].cool_until_ns <= now_ns)
            n += e->hosts[i].slots;
    return n;
}

int elastic_hostfile(struct elastic *e, FILE *f, const char *path, int n, int64_t now_ns)
{
    if (elastic_slots(e, now_ns) < n) {
        snprintf(e->error, sizeof(e->error), "%d slots wanted, %d available", n, elastic_slots(e, now_ns));
        fclose(f);
        return -1;
    }
    int left = n;
    for (int i = 0; i < e->nhosts; i++) {
        struct elastic_host *h = &e->hosts[i];
        h->launched = h->unreachable = false;
        if (!h->listed || h->cool_until_ns > now_ns || left == 0)
            continue;
        int k = h->slots < left ? h->slots : left;
        fprintf(f, "%s slots=%d\n", h->name, k);
        h->launched = true;
        left -= k;
    }
    if (fclose(f) != 0) {
        snprintf(e->error, sizeof(e->error), "%s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Whether two host names name one host: equal but for case, or one is the other's
   first label (a short name beside its FQDN). */
static bool same_name(const char *a, const char *b)
{
    if (strcasecmp(a, b) == 0)
        return true;
    size_t la = strcspn(a, "."), lb = strcspn(b, ".");
    if (a[la] && b[lb])
        return false; /* two FQDNs: equal or not the same host */
    return la == lb && strncasecmp(a, b, la) == 0;
}

/* Whether the address sa is one of addrs (space-separated, numeric). */
static bool addr_in(const struct sockaddr *sa, const char *addrs)
{
    char want[INET6_ADDRSTRLEN] = "";
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, want, sizeof(want));
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, want, sizeof(want));
    size_t wl = strlen(want);
    for (const char *p = addrs; wl && *p; p += strcspn(p, " "), p += strspn(p, " "))
        if (strncmp(p, want, wl) == 0 && (p[wl] == ' ' || p[wl] == '\0'))
            return true;
    return false;
}

/* Whether the listed name resolves to (or is) one of addrs. flags: AI_NUMERICHOST for a
   numeric name alone (no resolver). */
static bool resolves_to(const char *name, const char *addrs, int flags)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = flags}, *res = NULL;
    if (!addrs || !*addrs || getaddrinfo(name, NULL, &hints, &res) != 0)
        return false;
    bool hit = false;
    for (const struct addrinfo *r = res; r && !hit; r = r->ai_next)
        hit = addr_in(r->ai_addr, addrs);
    freeaddrinfo(res);
    return hit;
}

int elastic_match(const struct elastic *e, const char *host, const char *addrs, int *idx, int max)
{
    int n = 0;
    /* By name, or by a listed address; a listed name is resolved only when neither
       matched (the resolver's own bound applies). */
    for (int pass = 0; pass < 2 && n == 0; pass++) {
        for (int i = 0; i < e->nhosts && n < max; i++) {
            const struct elastic_host *h = &e->hosts[i];
            if (pass == 0 ? same_name(h->name, host) || resolves_to(h->name, addrs, AI_NUMERICHOST)
                          : resolves_to(h->name, addrs, 0))
                idx[n++] = i;
        }
    }
    return n;
}

int elastic_cool(struct elastic *e, const char *host, const char *addrs, int64_t now_ns, char *as, size_t cap)
{
    int idx[ELASTIC_MAX_HOSTS], n = elastic_match(e, host, addrs, idx, ELASTIC_MAX_HOSTS);
    as[0] = '\0';
    for (int k = 0; k < n; k++)
        e->hosts[idx[k]].cool_until_ns = now_ns + (int64_t)e->cooldown_ms * 1000000;
    if (n > 0)
        snprintf(as, cap, "%s", e->hosts[idx[0]].name);
    return n;
}
