/*
 * detector/det.h - the failure detector: the one header of detector/ that other parts
 * include. Design: detector/det_proto.c (file header) and docs/DETECTOR.md.
 *
 * One detector per worker, on its own thread with its own UDP socket. It never calls MPI:
 * the caller exchanges addresses (det_local_addr -> MPI_Allgather -> det_start) from the
 * thread that owns MPI.
 *
 * Members are identified by their rank at start (0 .. nslots-1). Slots at or above the
 * initial world are spares: representable in every view, members only once recovery
 * installs a view that contains them (det_install_view).
 *
 * Thread safety: every function below may be called from any thread while the detector
 * runs, except det_open/det_start/det_close (the owning thread only).
 */
#ifndef RK_DET_H
#define RK_DET_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"

#define DET_MAX_SLOTS 4096          /* ranks at start + spares */
#define DET_KEY_BYTES 32

typedef struct det det;

/* What a worker advertises to the others (exchanged as raw bytes over MPI). */
typedef struct det_addr {
    uint32_t ipv4;                  /* network byte order */
    uint16_t port;                  /* network byte order */
    uint8_t loopback;               /* 1: bound to loopback (single-host job only) */
    uint8_t pad_;
    uint64_t host_id;               /* hash of the host name: who shares a host */
} det_addr;

/* The membership as this worker sees it. */
typedef struct det_view {
    uint64_t epoch;                 /* bumped on every membership change */
    int nslots;
    int nmembers;
    uint64_t members[DET_MAX_SLOTS / 64]; /* bit r: slot r is a member */
} det_view;

static inline bool det_view_has(const det_view *v, int r)
{
    return r >= 0 && r < v->nslots && (v->members[r / 64] >> (r % 64)) & 1;
}

typedef struct det_cfg {
    int rank;                       /* this worker's rank at start */
    int world;                      /* members at start: ranks 0 .. world-1 */
    int nslots;                     /* world + spares (<= DET_MAX_SLOTS); 0: world */
    int heartbeat_ms;               /* period */
    const char *iface;              /* interface name, IPv4 address or subnet a.b.c.d/n; NULL: outward */
    rk__evlog *ev;                  /* event log (may be NULL); not owned */
    void (*watch)(void *arg);       /* called by the detector's thread each turn (at least
                                       every heartbeat), outside its lock; NULL: none */
    void *watch_arg;
    int parent_fd;                  /* > 2: a pipe to this worker's parent (rekindle run's
                                       wrapper), told what it needs to report the worker's
                                       death (det_parent_*); 0: none. Not owned */
    const det_view *view0;          /* NULL: ranks 0 .. world-1 at epoch 0. A worker that joins
                                       a running job (recover/join.c): the members' view and
                                       epoch, itself in it (world: nslots); read by det_start */
} det_cfg;

enum det_event_kind {
    DET_EV_SUSPECT = 1,   /* peer silent; others asked to probe it */
    DET_EV_REFUTED,       /* a suspect answered: alive again */
    DET_EV_DEAD,          /* peer declared dead: removed from the view */
    DET_EV_LEFT,          /* peer left cleanly (det_close): removed from the view */
    DET_EV_FENCED,        /* this worker was declared dead: it stopped sending */
    DET_EV_VIEW,          /* recovery installed a new view */
    DET_EV_ADMIT,         /* a member asked that spare `peer` join the ring as an additional
                             member (det_admit: growth in place); the member set is unchanged */
};

typedef struct det_event {
    int kind;             /* enum det_event_kind */
    int peer;             /* rank at start (self for FENCED, -1 for VIEW) */
    uint64_t epoch;       /* view epoch after the event */
    double after_ms;      /* silence of peer when it was suspected/declared */
    int64_t t_ns;         /* CLOCK_REALTIME when this worker learned it */
    int via;              /* DEAD: enum det_via, how the death was learned */
} det_event;

enum det_via {
    DET_VIA_SILENCE = 0,  /* its observers heard nothing for the timeout */
    DET_VIA_PARENT,       /* its parent saw it end (an exit or a kill) and said so */
};

/* Counters of everything received and dropped (never acted on). */
typedef struct det_stats {
    uint64_t tx_pkts, tx_bytes, rx_pkts, rx_bytes;
    uint64_t rx_ok;
    uint64_t drop_short, drop_oversize, drop_magic, drop_version, drop_job, drop_mac;
    uint64_t drop_replay, drop_malformed, drop_nonmember;
} det_stats;

/* Binds the socket (cfg->iface, or the host's outward IPv4: the first non-loopback address
   of an UP interface, else loopback). No thread yet. *out owned by the caller, det_close. */
int det_open(det **out, const det_cfg *cfg);
/* The address to advertise. */
void det_local_addr(const det *d, det_addr *out);
/* Starts the thread. addrs[0..world-1] from every worker (index = rank at start); key: the
   job's 32-byte key (det_key_from_secret); salt: 32 random bytes of this launch attempt,
   the same on every worker (rank 0 draws them at rk_init): the MAC key is derived from
   both, so datagrams of an earlier attempt are rejected. Returns 0 or a negative code. */
int det_start(det *d, const det_addr *addrs, const uint8_t key[DET_KEY_BYTES], const uint8_t salt[DET_KEY_BYTES]);
/* Tells the members this worker leaves (unless fenced), stops the thread, closes the
   socket, frees; *d = NULL. Never waits on a peer. NULL-safe. */
void det_close(det **d);

/* Parses RK_JOB_SECRET-style text (64 hex chars) into the MAC key; RK_E_OPTION if bad. */
int det_key_from_secret(const char *hex, uint8_t key[DET_KEY_BYTES]);
/* A fresh random key (for a job without a secret: rank 0 makes it, MPI shares it). */
int det_key_random(uint8_t key[DET_KEY_BYTES]);

/* An atomic counter bumped on every membership change and every event: poll it. */
uint64_t det_seq(const det *d);
/* An eventfd readable after each bump (read it to rearm); for poll(). */
int det_wait_fd(const det *d);
/* Copies the current view. */
void det_view_get(const det *d, det_view *out);
/* Pops the oldest unread event: 1 and *ev filled, 0 if none. Bounded queue: the oldest
   are dropped (and counted in *lost if non-NULL) when nobody reads. */
int det_next_event(det *d, det_event *ev, uint64_t *lost);
/* Whether the others declared this worker dead. */
bool det_fenced(const det *d);
/* A worker started while the job runs (det_cfg.view0) not yet asked in by the members:
   its detector observes no one until then (det_proto.c I12). */
bool det_unadmitted(const det *d);
/* A worker started while the job runs, at `slot`, was given the members' view of `epoch`
   (det_join_info): when it is asked in, the declarations since reach it (det_proto.c I12). */
void det_joiner_knows(det *d, int slot, uint64_t epoch);
/* Recovery agreed on a new membership (epoch must exceed the current one; it may add
   spares, never a rank declared dead). Returns 0, -EINVAL, or RK_E_FENCED. */
int det_install_view(det *d, const det_view *v);
/* Asks every member that spare `slot` join the ring as an additional member (growth in
   place, det_proto.c I11): each member's detector bumps its epoch and emits DET_EV_ADMIT,
   this one's included. A slot no process held yet (a worker started while the job runs,
   whose address every member was given: det_set_addr) becomes a member of every view by
   the same declaration (I12). 0 (also if asked already), -EINVAL, RK_E_FENCED. */
int det_admit(det *d, int slot);
/* What a worker that joins needs to start its detector among these members: the job's key
   and the attempt's salt given to det_start, where every slot listens (nslots entries,
   port 0: unknown) and the current view. -EINVAL before det_start or after det_close. */
int det_join_info(det *d, uint8_t key[DET_KEY_BYTES], uint8_t salt[DET_KEY_BYTES], det_addr *addrs,
                  det_view *view);
void det_stats_get(const det *d, det_stats *out);
/* Where a spare listens, once known (before det_install_view makes it a member). */
int det_set_addr(det *d, int slot, const det_addr *a);
/* The UDP port bound (host byte order), for diagnostics and tests. */
int det_port(const det *d);

/* ---- the worker's parent: reports its death at once (det_parent.c) ---------------------- *
 * Under `rekindle run` each worker is the child of a wrapper, which learns of its death the
 * moment it happens (waitpid). The worker's detector tells the wrapper, through a pipe
 * (det_cfg.parent_fd), the attempt's salt, its slot and where every slot listens; the
 * wrapper holds the job's key (RK_JOB_SECRET, inherited like the worker's) and, when the
 * worker exits or is killed, sends every member a DEATH datagram under the attempt's MAC
 * key. A stopped worker is never reported: the wrapper reports only what waitpid says ended,
 * or a worker every thread of which is inside its exit (det_proc_ending: the kernel tears a
 * CUDA process down for tens of ms before waitpid can say so). */
typedef struct det_parent det_parent;
/* fd: the pipe's read end (made non-blocking here; owned by the caller); key: the job's.
   *out owned by the caller, det_parent_close. */
int det_parent_open(det_parent **out, int fd, const uint8_t key[DET_KEY_BYTES]);
/* Reads what the worker told, without blocking. 0: more may come; 1: the pipe is closed
   (the worker is ending, or exec'd another program): do not poll it again (what it told
   is kept for the report). */
int det_parent_read(det_parent *pp);
/* The worker ended with wait status `status` (-1: ending, its status not known yet: P5):
   tells every known member at once. Returns how many datagrams were sent (0: the worker's
   detector was not running). */
int det_parent_report(det_parent *pp, int status);
/* Whether a report would be sent now: the worker's detector started and not closed. */
bool det_parent_armed(const det_parent *pp);
void det_parent_close(det_parent **pp);
/* Whether process pid (the caller's child, not yet reaped) can run no more code of its
   own: 1 when every thread of it is inside the kernel's exit, a zombie or gone (its death
   may be reported before waitpid returns it: det_parent.c, P5), 0 when some thread may
   still run or the threads cannot be read, -EINVAL / -ENOMEM. statfd: /proc/PID/stat kept
   open by the caller (read again from its start: no open a call), or -1. One read of it
   while the main thread runs. */
int det_proc_ending(pid_t pid, int statfd);
/* One thread's state letter, flags (PF_*) and the process's thread count from its stat
   file: `path`, or `fd` when >= 0 (read again from its start). 0, -ENOENT (gone), -errno,
   -EINVAL (unreadable). threads may be NULL. */
int det_proc_stat(const char *path, int fd, char *state, unsigned long *flags, long *threads);

#endif
