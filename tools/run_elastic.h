/*
 * tools/run_elastic.h - `rekindle run --host-discovery-script`: the hosts a job may run
 * on, as a discovery script reports them (Horovod's format), with a cool-down for hosts
 * that lost workers. tools/cmd_run.c sizes every launch from it and grows a running job
 * (docs/LAUNCHER.md, "Elastic: hosts that come and go").
 */
#ifndef RK_RUN_ELASTIC_H
#define RK_RUN_ELASTIC_H

#include <stdbool.h>
#include <stdint.h>

enum { ELASTIC_MAX_HOSTS = 1024, ELASTIC_HOST_LEN = 256 };

struct elastic_host {
    char name[ELASTIC_HOST_LEN];
    int slots;
    int64_t cool_until_ns; /* CLOCK_MONOTONIC; 0: not cooling down */
    bool listed;           /* in the script's last answer */
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
/* Writes an Open MPI hostfile of n slots ("host slots=K" lines) from the listed hosts not
   cooling down, in the script's order. -1 if they have fewer than n slots or the file
   cannot be written (e->error says which). */
int elastic_hostfile(struct elastic *e, const char *path, int n, int64_t now_ns);
/* A worker on `host` was lost: no growth onto it until now_ns + cooldown. Returns
   whether the host was known. */
bool elastic_cool(struct elastic *e, const char *host, int64_t now_ns);

#endif
