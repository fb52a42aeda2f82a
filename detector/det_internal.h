/*
 * detector/det_internal.h - private to detector/ (and its tests): the protocol state
 * machine (det_proto.c), the wire format and its authentication (det_wire.c).
 */
#ifndef RK_DET_INTERNAL_H
#define RK_DET_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>

#include "det.h"

/* ---- messages (det_proto.c <-> det_wire.c) -------------------------------------------- */
enum detm_type {
    DETM_HB = 1,     /* heartbeat to a ring successor (observer)                         */
    DETM_PING,       /* are you alive? subject = target, origin = who asks               */
    DETM_ACK,        /* answer to PING: subject = the live one, origin = who asked        */
    DETM_PING_REQ,   /* please PING subject for origin (SWIM indirect probe)             */
    DETM_SUSPECT,    /* subject is suspected at incarnation inc: refute if it is you      */
    DETM_ALIVE,      /* subject (= sender) refutes: incarnation inc                        */
    DETM_DECL,       /* membership news only (declarations in decl[])                     */
    DETM_DECL_ACK,   /* got the declarations in decl[] (stop piggybacking them)           */
    DETM_LEAVE,      /* the sender leaves cleanly                                          */
    DETM_DEATH,      /* from the parent of src (rekindle run's wrapper): src ended (exit or
                        kill; inc = its wait status); sent with seq >= DETW_PARENT_SEQ      */
    DETM_TYPE_MAX
};

#define DETM_MAX_DECL 16
/* detm_decl.silence_ms: this bit set (and not all bits: a clean leave) means the death was
   learned from the worker's parent (DETM_DEATH), not from its silence. */
#define DETM_DECL_PARENT 0x80000000u
/* detm_decl.silence_ms of a request that spare `rank` join the members (growth in place,
   det_proto.c I11): no change of the member set. A silence is clamped below it. */
#define DETM_DECL_ADMIT 0xfffffffeu
#define DETM_DECL_MAX_MS 0x7ffffff0u

/* A membership change: rank `rank` is out (dead, or left when `left`). */
typedef struct detm_decl {
    uint32_t rank;
    uint32_t silence_ms; /* declarer's silence of rank when it declared (0: left) */
} detm_decl;

typedef struct detm {
    int type;
    int src, dst;        /* ranks at start */
    uint32_t inc;        /* sender's incarnation (ALIVE/SUSPECT: subject's) */
    uint64_t epoch;      /* sender's view epoch */
    int subject, origin; /* PING/ACK/PING_REQ/SUSPECT/ALIVE; -1: none */
    uint64_t nonce;
    int ndecl;
    detm_decl decl[DETM_MAX_DECL];
} detm;

/* ---- the protocol state machine (det_proto.c) ---------------------------------------- */
typedef struct detp detp;

typedef struct detp_cfg {
    int self, world, nslots;
    int64_t period_ns;
    int k;             /* observers per member (>= 2 when the world allows) */
    int nhelpers;      /* members asked for indirect probes */
    uint64_t seed;     /* nonces */
    const det_view *view0; /* NULL: ranks 0 .. world-1 at epoch 0; else the members and epoch
                              to start from (a worker that joins a running job, I12) */
} detp_cfg;

int detp_create(detp **out, const detp_cfg *cfg, int64_t now);
void detp_destroy(detp **p);
/* An authenticated message arrived. */
void detp_recv(detp *p, const detm *m, int64_t now);
/* Runs the timers: heartbeats due, suspicions, declarations. */
void detp_tick(detp *p, int64_t now);
/* When detp_tick must run next (absolute ns). */
int64_t detp_next_deadline(const detp *p);
/* Queue a LEAVE to every member (det_close). */
void detp_leave(detp *p, int64_t now);
/* Outputs: 1 and the message or event filled, 0 when empty. */
int detp_pop_send(detp *p, detm *m);
int detp_pop_event(detp *p, det_event *ev);
void detp_view(const detp *p, det_view *out);
bool detp_fenced(const detp *p);
/* A joiner (detp_cfg.view0) whose own ADMIT has not reached it yet (I12). */
bool detp_unadmitted(const detp *p);
/* Joiner r was given the members' view of `epoch` (I12): what followed is news to it. */
void detp_joiner_knows(detp *p, int r, uint64_t epoch);
int detp_install_view(detp *p, const det_view *v, int64_t now);
/* This member asks that spare r join the members (I11): 0 (also when r was asked already),
   -EINVAL (r not a member, or self), RK_E_FENCED. */
int detp_admit(detp *p, int r, int64_t now);
/* Diagnostics for tests: the silence timeout (ns) now applied to observed peer r, or -1
   if this member does not observe r; and r's state (enum below). */
int64_t detp_timeout_ns(const detp *p, int r);
int detp_peer_state(const detp *p, int r);
enum { DETP_ALIVE = 0, DETP_PROBING, DETP_SUSPECT, DETP_DEAD, DETP_NONMEMBER };

/* ---- wire format and authentication (det_wire.c) -------------------------------------- */
#define DETW_MAGIC 0x54444b52u /* "RKDT" little-endian */
#define DETW_VERSION 2
/* A worker's parent (det_parent.c) numbers its datagrams from here: the worker's own
   numbers never reach it, so the two never collide in a receiver's replay window, and a
   DEATH below it (or anything else above it) is malformed. */
#define DETW_PARENT_SEQ (1ull << 62)
#define DETW_HDR 60
#define DETW_MAC 32
#define DETW_MAX (DETW_HDR + 8 * DETM_MAX_DECL + DETW_MAC)

enum detw_verdict {
    DETW_OK = 0, DETW_SHORT, DETW_OVERSIZE, DETW_BADMAGIC, DETW_BADVERSION, DETW_BADJOB,
    DETW_BADMAC, DETW_REPLAY, DETW_MALFORMED, DETW_NONMEMBER
};

typedef struct detw {
    uint8_t mac_key[DET_KEY_BYTES];
    uint64_t job;
    int nslots, self;
    uint64_t tx_seq;
    uint64_t *rx_top;  /* per sender: highest seq accepted */
    uint64_t *rx_win;  /* per sender: bit i = seq rx_top - i seen */
} detw;

/* key: the job's (from its secret): gives the job id; salt: the launch attempt's, drawn by
   rank 0 at rk_init: with key, gives the MAC key. */
int detw_init(detw *w, const uint8_t key[DET_KEY_BYTES], const uint8_t salt[DET_KEY_BYTES], int nslots,
              int self);
void detw_fini(detw *w);
/* Encodes m with the next sequence number and its MAC; returns the length. */
size_t detw_encode(detw *w, const detm *m, uint8_t *buf);
/* Checks and decodes; the replay window is updated only for an authentic packet. */
int detw_decode(detw *w, const uint8_t *buf, size_t len, detm *m);
/* Adds a verdict to the counters. */
void detw_count(det_stats *s, int verdict, size_t len);

/* ---- the channel from a worker to its parent (det_parent.c) --------------------------- */
/* What the worker's detector tells its parent through the pipe det_cfg.parent_fd: the
   attempt's salt and its slot at det_start, where every slot listens (at det_start and
   det_set_addr), and that it closed (det_close: nothing to report any more). */
void detpar_tell_start(int fd, int self, int nslots, const uint8_t salt[DET_KEY_BYTES],
                       const struct sockaddr_in *addrs);
void detpar_tell_addr(int fd, int slot, const struct sockaddr_in *a);
void detpar_tell_close(int fd);

#endif
