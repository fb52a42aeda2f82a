/*
 * recover/rec_internal.h - the rk_ctx behind the public API, and the seams through which
 * each part plugs into it. Private to recover/.
 *
 * Each part has one glue file here that owns its hooks and its public functions:
 *   api_ckpt.c  - checkpoint engine: rk_register, rk_resume, rk_checkpoint, rk_wait,
 *                 rec_ckpt_open/close/step_done
 *   api_det.c   - failure detector: rec_det_open/close, and the membership hooks
 *                 (rec_membership_changed, rec_ring_changed)
 *   api_ring.c  - allreduce ring:   rk_allreduce, rk_broadcast, rec_ring_open/close
 * api.c holds what is common: rk_init, rk_finalize, rk_step_done, rk_rank/world/next_step.
 * Recovery: recovery.c (the rounds), rec_msg.c (their messages), coord.c (the decision),
 * rollback.c (the rollback, its design in its header), rebuild.c (the pure plan of a
 * rollback of sharded state).
 */
#ifndef RK_REC_INTERNAL_H
#define RK_REC_INTERNAL_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "../common/common.h"

#define REC_MAX_DIMS 8
#define REC_MAX_NAME 255

/* A registered tensor (rk_register). The buffer stays the caller's. */
struct rec_tensor {
    char *name;           /* validated path, owned copy */
    void *ptr;            /* the caller's buffer (NULL only when nbytes == 0) */
    rk_dtype dtype;
    int ndim;             /* 0: a scalar */
    int64_t shape[REC_MAX_DIMS];
    size_t nbytes;
    unsigned flags;       /* 0, RK_SHARDED or RK_PER_RANK; RK_DEVICE with 0 */
    /* RK_SHARDED: this rank's rows are [row0, row0 + shape[0]) of rows_global (agreed at
       rk_register, re-split evenly at a membership change: resplit in rollback.c; a
       spare's rows_global is -1 until a recovery brings it in and it learns it). */
    int64_t row0, rows_global;
    int64_t bound_rows;   /* RK_SHARDED: the rows ptr holds (rk_register, rk_rebind) */
};

/* A sharded slice that differs in size from its buffer (bound_rows) after a recovery: its
   restored rows wait in the held snapshot for rk_rebind; ptr is the old buffer. */
static inline bool rec_tensor_pending(const struct rec_tensor *r)
{
    return (r->flags & RK_SHARDED) && r->shape[0] != r->bound_rows;
}

struct ckpt_engine;
struct det;
struct rec_xfer;
struct ring;
struct rec_joining;
struct rec_join_welcome;

struct rk_ctx {
    rk_options opt;       /* validated copy that owns its strings (rk__options_keep): the
                             caller's may go as soon as rk_init returns */
    char *job_secret;     /* RK_JOB_SECRET as read at rk_init (then removed from the
                             environment); wiped and freed once the detector has its key */
    int rank0;            /* rank at start: event-log file name, log prefix */
    int world0;           /* world size at start */
    int host_ranks;       /* ranks at start on this worker's host (the detector's host_id) */
    int rank, world;      /* current, renumbered densely after a shrink */
    int64_t next_step;
    bool mirror_pending;  /* the last snapshot's partner copy is still to be sent (api_ckpt.c) */
    struct {              /* snapshots taken, and the time training waited for their copies */
        int64_t taken;
        double wait_ms, max_ms;
    } snap;
    struct rec_tensor *tensors; /* registration order */
    size_t ntensors, cap_tensors;
    bool mpi_owned;       /* rk_init called MPI_Init_thread, rk_finalize finalizes */
    int64_t start_deadline; /* rk_init's collectives end by then (rec_start_wait) */
    MPI_Comm comm;        /* duplicate of MPI_COMM_WORLD, errors returned not fatal */
    rk__evlog *ev;
    /* recovery (recover/recovery.c) */
    int *view, nview;         /* the agreed members, ranks at start, ascending */
    int *spares, nspares;     /* spare workers not used yet, ranks at start (RK_SPARES) */
    bool *admit;              /* by rank at start (world0): a spare asked to join as an additional
                                 member, known from the detector (DET_EV_ADMIT; recovery.c G1) */
    char *grow_file;          /* RK_RUN_RECORDS/grow-to: the world the launcher asks for (G2) */
    int64_t grow_poll_ns;     /* CLOCK_MONOTONIC of the next look at it */
    bool grow_file_refused;   /* it was refused (not this user's own): said once */
    bool is_spare;            /* this worker waits in rk_resume until recovery needs it */
    uint64_t agreed_epoch;    /* the detector epoch of that view */
    uint64_t seen_seq;        /* det_seq() when last looked at */
    bool change_pending;      /* the detector's view differs from the agreed one */
    bool change_lost;         /* and a member of the agreed one is lost or this one fenced
                                 (not growth alone, recovery.c G1) */
    int64_t loss_ns;          /* CLOCK_MONOTONIC when the detector declared the loss not yet
                                 recovered (0: none): the rounds' schedule starts there */
    struct rec_xfer *xfers;   /* messages MPI may still be sending (rec_msg.c) */
    int nxfers, cap_xfers;
    struct ckpt_engine *ckpt; /* NULL: checkpoints off or engine not built */
    int64_t disk_newest;      /* the checkpoint directory's newest committed step at rk_init,
                                 reported until rk_resume (then -1: the engine's own) */
    struct det *det;          /* NULL: detector not running */
    struct ring *ring;        /* NULL: ring not built */
    struct rec_dev *dev;      /* rk_allreduce's device path (api_ring_nccl.c); NULL: not looked at */
    int nslots;               /* detector slots: world0 + RK_JOIN_SLOTS (newcomers') */
    int *slot_rank;           /* slot -> rank in comm (-1: none); NULL: the identity */
    int next_join_slot;       /* the slot of the next newcomer (J12: alike on every member) */
    int64_t join_poll_ns;     /* M0: CLOCK_MONOTONIC of its next look at the request (J16) */
    int64_t join_retry_ns;    /* M0: no join started before (one given up on: J17) */
    int64_t unasked_until_ns; /* a newcomer: the end of its wait to be asked in (J15), 0 none */
    int peers_slot0;          /* a newcomer: the first slot of the others started with it (J20) */
    uint64_t peers_want, peers_have; /* their bits from peers_slot0: all, and whose address came */
    struct rec_joining *joining; /* a join under way (join_proto.c), NULL: none */
    uint64_t ckpt_nonce;      /* the checkpoints' nonce, agreed at rk_init (a newcomer's too) */
    struct {                  /* the wedge watchdog (api_det.c), on the detector's thread */
        uint64_t call;        /* the MPI call in progress at the last turn */
        int turns;            /* turns it has been in progress */
    } wedge;
};

/* Hooks; each returns 0 or a negative code, and *_close undoes *_open (safe on a ctx
   whose open failed or never ran). */
int rec_ckpt_open(rk_ctx *ctx);
int rec_ckpt_close(rk_ctx *ctx);
int rec_ckpt_step_done(rk_ctx *ctx, int64_t step);
int rec_det_open(rk_ctx *ctx);
/* A newcomer's (join_proto.c): the detector started from the members' welcome. */
int rec_det_open_joined(rk_ctx *ctx, struct rec_join_welcome *w);
void rec_det_close(rk_ctx *ctx);
/* Wipes and frees ctx->job_secret (rec_det_open does once the detector has its key). */
void rec_det_forget_secret(rk_ctx *ctx);
/* 0 while this worker is a member; RK_E_FENCED once the others declared it dead (it must
   then stop: every API call returns this). Cheap: called at the top of rk_step_done and
   rk_allreduce. */
int rec_det_status(rk_ctx *ctx);
int rec_ring_open(rk_ctx *ctx);
void rec_ring_close(rk_ctx *ctx);
/* The byte-wise broadcast (api_ring.c): every member's buf[0..n) becomes the bytes of the
   members that `have` them (all of them alike: one root, or every member with the same
   bytes); the others' are zeroed first, then a byte-wise MAX over the ring with `reduce`
   (rk_allreduce: a loss recovers; rec_ckpt_call: a loss abandons it). Exact for any bytes;
   abortable, unlike MPI_Bcast. Host memory; n == 0 makes no call. rk_broadcast's, and the
   rollback's (rollback.c B4). */
int rec_spread(rk_ctx *ctx, void *buf, size_t n, bool have,
               int (*reduce)(rk_ctx *ctx, void *buf, size_t count, rk_dtype dtype, rk_op op));
#if defined(RK_HAVE_NCCL)
/* rk_allreduce's device buffers (api_ring_nccl.c, CUDA + NCCL builds): 1 when buf is device
   memory, 0 for any other (and always without a device), or -ENOMEM; the allreduce of a
   device buffer (NCCL, or pinned staging and the MPI ring), with the MPI ring's errors;
   rec_ring_dev_close (from rec_ring_close) frees the communicator and the staging. */
struct ring_cancel;
int rec_ring_is_device(rk_ctx *ctx, const void *buf);
int rec_ring_dev_allreduce(rk_ctx *ctx, void *buf, size_t count, rk_dtype dtype, rk_op op,
                           const struct ring_cancel *c);
void rec_ring_dev_close(rk_ctx *ctx);
#endif

/* The registry (recover/registry.c). rec_registry_add validates everything and names
   what is wrong; rec_registry_free releases the copies, never the caller's buffers. */
int rec_registry_add(rk_ctx *ctx, const char *name, void *ptr, rk_dtype dtype, int ndim,
                     const int64_t *shape, unsigned flags);
void rec_registry_free(rk_ctx *ctx);
/* The registered tensor named name, NULL if none. */
struct rec_tensor *rec_registry_find(rk_ctx *ctx, const char *name);
/* Forgets the last registered tensor (a collective registration that failed). */
void rec_registry_pop(rk_ctx *ctx);
/* Bytes of one row (dimension 0) of t. */
size_t rec_row_bytes(const struct rec_tensor *t);
/* The group of per-rank state in a checkpoint; no registered name may start with it. */
#define REC_RANKS_GROUP "ranks"
/* Whether name can be a tensor's path in the checkpoint; why says what is wrong. */
bool rec_name_valid(const char *name, const char **why);

/* Recovery (recover/recovery.c, docs/PROTOCOL.md). rec_recovery_init after every part is
   open; rec_membership_changed is cheap (an atomic load) and tells whether the detector's
   view moved past the agreed one; rec_recover runs the rounds and returns RK_RECOVERED
   (state rolled back, ctx->next_step set) or an error every survivor gets alike.
   rec_recovery_fini keeps (rk__retain_forever) the copies of messages MPI may still send. */
int rec_recovery_init(rk_ctx *ctx);
void rec_recovery_fini(rk_ctx *ctx);
bool rec_membership_changed(rk_ctx *ctx);
/* Whether the change rec_membership_changed found loses a member (a death, a fence), not
   growth alone (recovery.c G1). */
bool rec_membership_lost(const rk_ctx *ctx);
bool rec_ring_changed(void *ctx);
int rec_recover(rk_ctx *ctx);
/* The recovery's messages (rec_msg.c; recovery.c R1, R6). rec_msg_send sends a copy and
   returns at once: 0; REC_AGAIN if MPI refused the send (nothing held then); -ENOMEM.
   rec_msg_recv takes one message of `tag` already waiting, from anyone, never blocking:
   its length (copied into buf, cap bytes at most) and *src; 0 if none waits or none could
   be taken now; REC_DROPPED if one was taken but not delivered (too long, or incomplete at
   the deadline). rec_msgs_progress frees the copies of sends completed; rec_msgs_settle
   waits for the sends until the deadline (0: test once) and keeps the rest's copies. */
#define REC_AGAIN 2              /* start the next round (distinct from RK_OK and RK_RECOVERED) */
#define REC_DROPPED (-1)
#define REC_POLL_NS (200 * 1000) /* between polls of MPI and the detector */
int rec_msg_send(rk_ctx *ctx, const void *msg, size_t len, int dst, int tag);
int rec_msg_recv(rk_ctx *ctx, int tag, void *buf, size_t cap, int *src, int64_t deadline);
/* The same by rank of another communicator (a join's: join_proto.c); dst and *src are
   ranks of comm, not slots. */
int rec_msg_send_on(rk_ctx *ctx, MPI_Comm comm, int dst, const void *msg, size_t len, int tag);
int rec_msg_recv_on(rk_ctx *ctx, MPI_Comm comm, int tag, void *buf, size_t cap, int *src, int64_t deadline);
void rec_msgs_progress(rk_ctx *ctx);
void rec_msgs_settle(rk_ctx *ctx, int64_t deadline);
/* Growth in place (recovery.c G1-G4). rec_grow_poll: on the lowest member, at most every
   REC_GROW_POLL_NS, reads the world the launcher asks for and asks the detector to admit
   as many waiting spares (det_admit). rec_grow_admit: a DET_EV_ADMIT of spare `slot` was
   read: true if it still waits (a membership change to agree on, as a loss is). */
#define REC_GROW_POLL_NS (50 * 1000000LL)
/* How long a growth request lets a ring call in flight run on before it is given up (api_det.c
   rec_ring_changed); a loss gives it up at once. */
#define REC_GROW_GRACE_NS (50 * 1000000LL)
#define REC_GROW_FILE "grow-to"
void rec_grow_poll(rk_ctx *ctx);
/* The grow file read whole (NUL-terminated; checked as G2 says): its length, 0 with none;
   rec_grow_world: the world its first line asks for, 0 with none. */
int rec_grow_read(rk_ctx *ctx, char *buf, size_t cap);
int rec_grow_world(const char *text);
bool rec_grow_admit(rk_ctx *ctx, int slot);
/* Under `rekindle run`: RK_RUN_RECORDS/<name>-<slot> into path; false when not under it
   (or the path does not fit). */
bool rec_records_path(char *path, size_t cap, const char *name, int slot);
/* Under `rekindle run`: whether the wrapper of the worker at `slot` recorded its end
   (RK_RUN_RECORDS/rank-<slot>, a regular file of this user, never followed through a link). */
bool rec_record_ended(int slot);
/* Under `rekindle run`: RK_RUN_RECORDS/<name>-<slot> written with text (may be NULL: an
   empty note), whole or not at all (written aside, renamed), never through a link. 0 (also
   when not under `rekindle run`), or -errno. */
int rec_record_note(const char *name, int slot, const char *text);
/* rk_init's collectives (MPI_Comm_idup, the detector's MPI_Iallgather, the checkpoint
   engine's MPI_Ibcast/MPI_Iallreduce): rq waited for until ctx->start_deadline (10 x
   RK_TIMEOUT_MS from rk_init's start), given up on at once when a worker's end is recorded
   (rec_record_ended); keep: the heap block MPI may still touch (common.h rk__mpi_wait_coll). */
int rec_start_wait(rk_ctx *ctx, MPI_Request *rq, void *keep, const char *what);
/* Processes started while the job runs (recover/join.c J8-J11). rec_join_spawn, on every
   member of `members` (ranks of parent) alike: spawns spec->n newcomers running
   spec->command with spec->argv (NULL-terminated; spec->hosts: Open MPI's "host" info, NULL:
   wherever mpirun has slots) and merges with them, on a thread; rec_join_newcomer, in such a
   newcomer: the merge from its side (parent: MPI_Comm_get_parent's). Both return at once.
   rec_join_poll: REC_AGAIN while the thread runs; then once 0 with out[] the merged
   communicator and its REC_JOIN_COMMS - 1 duplicates (the members first, in their order,
   then the newcomers), or the failed call's error. rec_join_end: always, last; a join
   still running is left where it is (J8), and rec_join_thread_left() is true from then on
   while its thread has not returned: MPI_Finalize must not be called (J9). */
#define REC_JOIN_COMMS 2
#define REC_JOIN_TAG 0x4a4f /* MPI_Comm_create_group's tag ("JO") */
typedef struct rec_join_spec {
    const char *command;  /* read at the root alone (the first member): may be NULL elsewhere */
    char *const *argv;
    int n;
    /* Per newcomer (n entries each), or NULL for none; an entry NULL or "" sets nothing:
       hosts[k] Open MPI's "host" (one of mpirun's allocation: docs/LAUNCHER.md), env[k] its
       "env" ("K=V" lines set in that newcomer alone). */
    const char *const *hosts;
    const char *const *env;
} rec_join_spec;
struct rec_join;
int rec_join_spawn(MPI_Comm parent, const int *members, int nmembers, const rec_join_spec *spec,
                   struct rec_join **out);
int rec_join_newcomer(MPI_Comm parent, struct rec_join **out);
int rec_join_poll(struct rec_join *j, MPI_Comm out[REC_JOIN_COMMS]);
void rec_join_end(struct rec_join **j);
bool rec_join_thread_left(void);
/* Workers started while the job runs, brought into the ring (join_proto.c J12-J15).
   Slots: a worker's detector slot (its rank at start; a newcomer's from world0 up) and its
   rank in ctx->comm differ once the job switched onto a merged communicator:
   rec_rank_of / rec_slot_of (-1: none). rec_join_route: where a newcomer of the join under
   way is reached before the switch (false: not one). rec_join_begin (every member alike,
   the same spec->n), then rec_join_progress at each rk_step_done; rec_join_switch, from
   apply_decision: the ranks of the decision's members, and *ring_comm the merged
   communicator the ring moves onto when it names a newcomer (MPI_COMM_NULL: it stays).
   The newcomer: rec_join_arrive (rk_init: the merge and the welcome, bounded),
   rec_join_welcome_apply (its ctx), rec_join_det_start (its detector, its address sent
   to every member and every other newcomer of the join, theirs taken), rec_join_welcome_free. */
#define REC_JOIN_WAIT 2   /* a join's bound, in RK_TIMEOUT_MS */
#define REC_JOIN_PORT0 1024   /* join_proto.c J22: a newcomer's first TCP port of Open MPI's, */
#define REC_JOIN_PORT_STEP 64 /* REC_JOIN_PORT0 + this x its slot (wrapped below 64512) */
struct rec_join_welcome;
struct det_cfg;
int rec_rank_of(const rk_ctx *ctx, int slot);
int rec_slot_of(const rk_ctx *ctx, int rank);
bool rec_join_route(const rk_ctx *ctx, int slot, MPI_Comm *comm, int *rank);
int rec_join_begin(rk_ctx *ctx, const rec_join_spec *spec);
void rec_join_progress(rk_ctx *ctx);
int rec_join_switch(rk_ctx *ctx, const int *members, int nmembers, int *ranks, MPI_Comm *ring_comm);
void rec_join_fini(rk_ctx *ctx);
int rec_join_arrive(rk_ctx *ctx, MPI_Comm parent, MPI_Comm *ring_comm, struct rec_join_welcome **w);
int rec_join_welcome_apply(rk_ctx *ctx, struct rec_join_welcome *w);
int rec_join_det_start(rk_ctx *ctx, struct rec_join_welcome *w, const struct det_cfg *base);
void rec_join_welcome_free(struct rec_join_welcome **w);
/* A newcomer: the addresses of the others started with it that came since, given to its
   detector (J20); nonblocking, called while it waits to be asked in. */
void rec_join_peers_poll(rk_ctx *ctx);
/* A spare's rk_resume: waits until a decision brings it into the ring (0), or the job
   ends without it (RK_E_SPARE_UNUSED), or no member is left (RK_E_PEER_LOST). */
int rec_spare_wait(rk_ctx *ctx);
/* rk_finalize on rank 0: tells the spares still waiting that they are not needed. */
void rec_release_spares(rk_ctx *ctx);
/* What a member offers the coordinator (rollback.c), in r: the steps of both generations
   held in memory (ckpt/snapshot.h S6) where they cover every tensor registered now (and,
   for sharded or per-rank state, their partner copy: S4), -1 where not or without
   `memory` (RK_ROLLBACK=disk); the newest committed step (-1: none); whether the job has
   sharded or per-rank state. rec_ckpt_held_step: the held one's alone. Then the rollback
   to a decision's step over the rebuilt ring. */
struct rec_decision;
struct rec_report;
void rec_ckpt_offer(rk_ctx *ctx, bool memory, struct rec_report *r);
int64_t rec_ckpt_held_step(rk_ctx *ctx);
/* Whether the job has sharded or per-rank state (rec_report.partnered). */
int rec_ckpt_partnered(const rk_ctx *ctx);
/* *from: where the state came from (enum rec_source): the decision's, or disk when the
   rollback from memory failed on some member and every member went to disk. */
int rec_ckpt_rollback(rk_ctx *ctx, const struct rec_decision *dec, int *from);
struct ckpt_tensor;
/* The registry as the engine sees it (api_ckpt.c); *out malloc'd (NULL with no tensor). */
int rec_ckpt_tensors(rk_ctx *ctx, struct ckpt_tensor **out);
/* How rec_restore_newest reads a checkpoint (the members take the least any asks). */
enum { REC_RESTORE_STAGED = 0, REC_RESTORE_CHECKED = 1, REC_RESTORE_INPLACE = 2 };
/* Restores, on every member, the newest checkpoint labelled below `below` that verifies on
   every member (rollback.c; rk_resume's and the rollback's from disk); collective over the
   ring. 0 with *step the step (-1: none there, buffers untouched), or an error every member
   gets alike. trc: rec_ckpt_tensors' failure, carried into the first collective. *how in:
   the way this member asks (NULL: staged), out: the way taken. */
int rec_restore_newest(rk_ctx *ctx, const struct ckpt_tensor *t, int trc, int64_t below, int *how,
                       int64_t *step);
/* What the members of a sharded or per-rank registration must have alike (registry.c):
   63 bits, never negative. */
int64_t rec_registration_hash(const struct rec_tensor *t);
/* A collective among the current members over the ring, abandoned as soon as the
   detector sees another member go (api_ckpt.c). */
int rec_ckpt_call(rk_ctx *ctx, void *v, size_t count, rk_dtype dtype, rk_op op);
/* The partner copy of the held snapshot (api_ckpt.c; ckpt/snapshot.h S4): collective over the
   ring, after every snapshot of a job with sharded or per-rank state. */
int rec_ckpt_mirror(rk_ctx *ctx);
/* The copy of the last snapshot into staging is done (a snapshot's copy, and a
   checkpoint's device tensors', run on after rk_step_done returns), bounded by
   RK_TIMEOUT_MS / 4: called before the registered state may change (rk_allreduce's
   return, rk_step_done); then, if rc is 0, the snapshot's pending partner copy is sent
   (collective: those calls come at the same points on every member). Returns rc (a copy
   that fails fails its snapshot or checkpoint, not the caller's call). */
int rec_ckpt_copied(rk_ctx *ctx, int rc);
/* rk_before_update: the copy's part of rec_ckpt_copied only (not collective). */
void rec_ckpt_before_update(rk_ctx *ctx);
/* A member is lost for good (recovery stopped, or the program finalizes without
   recovering): the checkpoint in flight stops waiting for it. */
void rec_ckpt_abandon(rk_ctx *ctx);

/* The plan of the rollback from memory of sharded and per-rank state (recover/rebuild.c). */
/* The even split of `rows` over `world` members: member r's count, its first row in *row0. */
int64_t rec_even_split(int64_t rows, int world, int r, int64_t *row0);

/* The plan of one tensor's rebuild, pure (unit-tested without MPI). The old ranks' pieces
   laid end to end (old rank order: a sharded tensor's global rows, per-rank state rank
   after rank) form a vector; old rank q's piece [at[q], at[q] + len[q]) is held now by a
   new member: q itself if it survived, else its right neighbour (the partner copy;
   rec_plan_held). Each new member r takes the range [lo[r], hi[r]) of that vector: for a
   sharded tensor the even split of the new world, for per-rank state the piece of old
   rank r (none for a rank beyond the old world). A new member with no old rank (a spare)
   holds nothing and receives its whole range. Every member computes the same plan from
   the agreed sizes. */
struct rec_plan {
    int w0, w;          /* old and new world */
    const int32_t *nr;  /* old rank -> new rank + 1 (0: lost), w0 */
    int32_t *old;       /* new rank -> old rank (-1: none), w */
    const int64_t *len; /* each old rank's piece, bytes (rec_plan_tensor) */
    int64_t *at;        /* where each starts, w0 + 1 */
    int64_t *lo, *hi;   /* each new rank's range, w */
    bool no_left;       /* the partner copies are not of the step (rollback.c B8): none is held */
};
/* One transfer of a shift: [a, b) of the vector (a == b: nothing), from old piece q. */
struct rec_move {
    int q;
    int64_t a, b;
};
/* p->old from p->nr; RK_E_INTERNAL if an old rank claims a new rank past w or two
   neighbours are lost (the first one's pieces are nowhere). */
int rec_plan_members(struct rec_plan *p);
/* at, lo and hi of one tensor: len[w0] its old pieces' sizes, sharded or per-rank, and
   for a sharded tensor its global rows of row_bytes each. */
void rec_plan_tensor(struct rec_plan *p, const int64_t *len, bool sharded, int64_t rows_global, int64_t row_bytes);
/* Old rank whose piece new member h holds in slot 0 (its own) or 1 (its lost left
   neighbour's partner copy); -1 if none. */
int rec_plan_held(const struct rec_plan *p, int h, int slot);
/* The part of old piece q that new member r takes: [*a, *b) of the vector (empty: a >= b). */
void rec_plan_take(const struct rec_plan *p, int q, int r, int64_t *a, int64_t *b);
/* Whether any member sends something at distance k from its held piece `slot`. */
bool rec_plan_sends(const struct rec_plan *p, int k, int slot);
/* What member me sends to me + k (of its piece `slot`) and receives from me - k (of that
   member's piece `slot`) in the shift (k, slot). */
void rec_plan_shift(const struct rec_plan *p, int me, int k, int slot, struct rec_move *send, struct rec_move *recv);
/* The new partner copy of member m (its left neighbour's new piece, l = m - 1) made from
   what m holds: in[] the parts of that piece m holds itself (its old piece and its left's
   partner copy), out[] the parts it must receive from l; each [a, b) of the vector, q
   the old piece it comes from (in[]) or -1 (out[]); at most 2 and 3. A piece outside
   the vector (per-rank state of a rank beyond the old world) is all out[], [0, bytes) of
   it with q -2. Returns the count of out[]; *nin that of in[]. */
int rec_plan_partner(const struct rec_plan *p, int m, bool sharded, int64_t bytes, struct rec_move in[2], int *nin,
                     struct rec_move out[3]);

#endif
