/*
 * tools/run_elastic.h - `rekindle run --host-discovery-script`: the hosts a job may run
 * on, as a discovery script reports them (Horovod's format), with a cool-down for hosts
 * that lost workers. tools/run_loop.c sizes every launch from it and grows a running job
 * (docs/LAUNCHER.md, "Elastic: hosts that come and go").
 */
#ifndef RK_RUN_ELASTIC_H
#define RK_RUN_ELASTIC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum { ELASTIC_MAX_HOSTS = 1024, ELASTIC_HOST_LEN = 256 };

struct elastic_host {
    char name[ELASTIC_HOST_LEN];
    int slots;
    int64_t cool_until_ns; /* CLOCK_MONOTONIC; 0: not cooling down */
    bool listed;           /* in the script's last answer */
    bool launched;         /* in the hostfile of the launch that runs (mpirun allocated it) */
    bool unreachable;      /* lost whole since that launch (its mpirun daemon with it) */
};

struct elastic {
    const char *script;
    int min_np, max_np;
    int interval_ms;  /* between two runs of the script while a job runs */
    int cooldown_ms;  /* a host that lost a worker is not grown onto for this long */
    int timeout_ms;   /* waiting for min_np slots before a launch */
    int64_t next_ns;  /* when the script runs next (CLOCK_MONOTONIC) */
    struct elastic_host hosts[ELASTIC_MAX_HOSTS];
    int nhosts;
    char error[256]; /* why the last discovery failed */
};

/* Parses the script's output: one "host" or "host:slots" a line (slots 1..65536; blank
   lines and lines starting with '#' are skipped). Hosts not in it are no longer listed;
   a host's cool-down is kept. -1 with e->error naming the line on a bad one. */
int elastic_parse(struct elastic *e, const char *out);
/* Runs the script (its stdout; at most 10 s, then it is killed) and parses what it
   printed. 0, or -1 with e->error saying why (the hosts are then left as they were). */
int elastic_discover(struct elastic *e);
/* Slots of the listed hosts not cooling down at now_ns. */
int elastic_slots(const struct elastic *e, int64_t now_ns);
/* Writes an Open MPI hostfile of n slots ("host slots=K" lines) into f (closed here; path
   names it in messages) from the listed hosts not cooling down, in the script's order. -1
   if they have fewer than n slots or the file cannot be written (e->error says which). */
int elastic_hostfile(struct elastic *e, FILE *f, const char *path, int n, int64_t now_ns);
/* A worker on `host` (its gethostname(), and addrs: its addresses, space-separated) was
   lost: no growth onto the hosts it is until now_ns + cooldown. A known host is it when
   the names are equal but for case, or one is the other's short name (node1 and
   node1.cluster), or the known name is one of addrs or resolves to one of them. Returns
   how many known hosts it is; `as` gets the first one's name. */
/* The known hosts a worker on `host` (addrs) is (the rule elastic_cool names), their indices
   into e->hosts in idx (at most max): how many. */
int elastic_match(const struct elastic *e, const char *host, const char *addrs, int *idx, int max);
int elastic_cool(struct elastic *e, const char *host, const char *addrs, int64_t now_ns, char *as, size_t cap);

#endif
