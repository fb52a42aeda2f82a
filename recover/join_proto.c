/*
 * recover/join_proto.c - what brings a worker started while the job runs from the merged
 * communicator (join.c) into the ring: the members' side (rec_join_begin, then
 * rec_join_progress at each rk_step_done), the newcomer's side inside rk_init
 * (rec_join_arrive), and the switch of every member onto the merged communicator at the
 * decision that brings the newcomer in (rec_join_switch, from apply_decision).
 * docs/LAUNCHER.md, "Joining processes started later".
 *
 * STATES of a join on a member (the function performing each transition)
 *
 *   SPAWNING --(the thread's spawn and merge returned: progress)--> ADDRESSING
 *            (the lowest member, M0, sends each newcomer its WELCOME on the merged
 *            communicator: its slot, the members' view, slots, addresses, the job's key)
 *   ADDRESSING (others) --(each newcomer's ADDR as it comes: det_set_addr, the newcomer
 *            joins the list of spares)--> a READY to M0 on the old communicator naming the
 *            newcomers whose address it has, each time that set grows; every one -> ASKED
 *   ADDRESSING (M0) --(the newcomers whose address every member of the view still alive
 *            has, M0 included: all of them, or those once the rest ended (their records)
 *            or after REC_JOIN_GRACE_MS)--> det_admit of each (det_proto.c I12, then
 *            recovery.c G1-G4 as for a spare held back at launch); every one -> ASKED
 *   ADDRESSING, ASKED --(a decision with a newcomer in it: rec_join_switch)--> done (the
 *            ring and the recovery's messages on the merged communicator, slots mapped to
 *            its ranks; a newcomer not asked by then is never asked: it ends at its bound)
 *   any --(its deadline passed, the thread failed, a member of the join lost)--> abandoned
 *
 * INVARIANTS
 *   J12 Every member starts a join over the same members (the agreed view) with the same
 *       newcomers' slots (ctx->next_join_slot, moved alike on every member), above every
 *       slot any process held, so the order of slots is the order of ranks in the merged
 *       communicator (the members first, in the order of their slots, then the newcomers)
 *       and the ring's dense ranks keep following the slots.
 *   J13 Nothing waits: each step is a nonblocking test at rk_step_done; the newcomer's own
 *       waits in rk_init are bounded by REC_JOIN_WAIT (x RK_TIMEOUT_MS).
 *   J14 A newcomer is asked in (det_admit) only once every member of the view has the
 *       merged communicators and the newcomer's address: a decision naming it can then be
 *       applied by each of them. M0 asks only before its deadline; the others give a join
 *       up only at twice theirs, so none gives up what M0 may still ask.
 *   J15 A member switches onto the merged communicator only at a decision that names a
 *       newcomer, which every member of the decision applies, so the members of one ring
 *       always talk on one communicator. A join given up on before leaves its thread as
 *       join.c J8 says, and the newcomer, never asked, ends its rk_init with an error, or,
 *       once past it, its wait in rk_resume (recovery.c rec_spare_wait) at (REC_JOIN_WAIT
 *       + 1) x RK_TIMEOUT_MS from its arrival.
 *   J16 Under `rekindle run` the launcher asks (docs/LAUNCHER.md): the grow file (recovery.c
 *       G2, the same checks) names the world wanted and, per worker to start, a join line
 *       ("join HOST", a host of mpirun's allocation). Only M0 reads it (request_poll, every
 *       REC_GROW_POLL_NS at rk_step_done), and only when the members and the live spares
 *       make less than asked; it sends every other member of the agreed view START (the
 *       agreed epoch, the first slot, how many: J20) and starts the join itself: each
 *       newcomer is this worker's own wrapper command (`rekindle run --rk-worker ...`, from
 *       /proc), told its slot in RK_RUN_SLOT, so its death is reported and its end recorded
 *       as any worker's. A
 *       member takes a START at rk_step_done only from the lowest of its view, of its
 *       agreed epoch, for slots not behind its own (it skips the slots M0 gave up on), with
 *       no join under way; any other is dropped, and M0's join then ends at its bound. The
 *       file names a size: once the newcomer is a member, reading it again asks nothing.
 *   J17 A join given up on is not started again by M0 before 2 x REC_JOIN_WAIT x
 *       RK_TIMEOUT_MS, by when every member has given it up (J14), so a new START never
 *       meets a member still inside the old join.
 *   J18 Under `rekindle run` a member still spawning gives the join up as soon as the
 *       newcomer's wrapper has recorded its end (RK_RUN_RECORDS/rank-<slot>, looked for
 *       every REC_GROW_POLL_NS): a newcomer that died before its merge returned never lets
 *       the spawn or the merge return, and waiting out the deadline only lengthens the time
 *       the members' threads spin inside them. Only while spawning: once merged, the
 *       newcomer's death is a peer's loss on the merged communicator, bounded as any.
 *   J19 Under `rekindle run`, when the spawn or the merge fails with an MPI error while no
 *       newcomer's end is recorded (Open MPI 4.1: a newcomer alive but slower to reach
 *       MPI_Init than the spawn's PMIx exchange bound, common/mpi.c), M0 writes why in
 *       RK_RUN_RECORDS/unjoined-<slot> (whole, renamed into place): the launcher then grows
 *       by a relaunch at once rather than at its bound, as starting another newcomer would
 *       fail alike (docs/LAUNCHER.md, "A newcomer slow to start").
 *   J20 A join starts every worker the grow file asks for at once (one spawn, a command
 *       per newcomer with its own host and RK_RUN_SLOT), not one join each. Each newcomer
 *       tells its detector's address to every member and to every other newcomer of the
 *       join (the welcome's map names them: a rank in the merged communicator, not in the
 *       view), and takes theirs as they come while it waits to be asked in
 *       (rec_join_peers_poll, never a wait of its own: a peer dead before it told must not
 *       hold it in rk_init while the members ask it in). M0 asks in the newcomers every
 *       member has the address of: all together when all told, else those that did once
 *       the rest ended (their records) or REC_JOIN_GRACE_MS after the first could be; one
 *       never asked ends at its bound (J15). Once asked in, a newcomer that dies is a lost
 *       spare (recovery.c G4), which costs the others, newcomers included, one round.
 *   J22 A newcomer never listens where a worker of the job listened before: its Open MPI
 *       TCP transport takes its ports from REC_JOIN_PORT0 + REC_JOIN_PORT_STEP x its slot
 *       (OMPI_MCA_btl_tcp_port_min_v4 and _v6, set in its environment unless the user set
 *       the first), and slots are never given twice (J12). Open MPI binds the first free
 *       port from 1024 up, so a newcomer started where workers were killed took their
 *       ports while the members' Open MPI still held endpoints of the dead workers there
 *       (sends abandoned to them stay queued and are tried again), and a connection meant
 *       for a dead worker could reach it. Found beside the stall after a join of two
 *       (docs/CHAOS.md, seed 4211), which it did not end: kept as wrong on its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../detector/det.h"
#include "rec_internal.h"

#define JOIN_MAGIC 0x4a4f494eu /* "JOIN" */
#define TAG_WELCOME 0x4a01
#define TAG_ADDR 0x4a02
#define TAG_READY 0x4a03
#define TAG_START 0x4a04
#define JOIN_HOSTS 64 /* join lines of the grow file read */

enum { J_SPAWNING, J_ADDRESSING, J_ASKED };

/* M0 asks in the newcomers whose addresses every member has once they all have, or, when
   some never tell (dead before their ADDR left), this long after the first could be asked:
   their starts differ by milliseconds (one spawn, one merge, one welcome each). */
#define REC_JOIN_GRACE_MS 1000

struct rec_joining {
    struct rec_join *j;
    int state;
    int64_t deadline;       /* CLOCK_MONOTONIC: M0's; the others give up at twice the span */
    int64_t look_ns;        /* the next look for the newcomers' end records (J18) */
    int64_t since;          /* CLOCK_MONOTONIC: when the join began */
    int slot0, n;           /* the newcomers' slots: slot0 .. slot0 + n - 1 */
    int *members, nmembers; /* the view at the start (slots) */
    MPI_Comm comm[REC_JOIN_COMMS]; /* merged: [0] the recovery's messages, [1] the ring */
    int *slot_rank;         /* nslots: rank of each slot in the merged communicator, -1 none */
    uint64_t addr;          /* bit k: newcomer slot0 + k's address came (n <= 64) */
    uint64_t asked;         /* bit k (M0): det_admit done for it */
    uint64_t *ready;        /* nmembers (M0): the newcomers each member has the address of */
    uint64_t told;          /* (others) the newcomers named in the last READY sent */
    int64_t can_since;      /* (M0) when a newcomer first could be asked, 0 before */
};

/* What M0 sends each newcomer, then int32 view[nview], spares[nspares], slot_rank[nslots]
   and det_addr addrs[nslots]. */
struct welcome {
    uint32_t magic;
    int32_t slot, world0, nslots, world, nview, nspares, next_join_slot;
    uint64_t agreed_epoch, nonce;
    uint8_t key[DET_KEY_BYTES], salt[DET_KEY_BYTES];
    det_view view;
};

/* A newcomer's ADDR, to every member and every other newcomer of its join: where its
   detector listens, and the epoch of the view the welcome gave it (det_joiner_knows). */
struct addr {
    det_addr a;
    uint64_t epoch;
};

struct ready {
    uint32_t magic;
    int32_t slot0;
    uint64_t have; /* bit k: the address of newcomer slot0 + k came */
};

/* M0's request to every other member to start a join (J16). */
struct start {
    uint32_t magic;
    int32_t slot0, n;
    uint32_t pad;
    uint64_t epoch; /* the agreed view's: a member of another view drops it */
};

/* ---- addressing: slots and ranks ---------------------------------------------------------- */

int rec_rank_of(const rk_ctx *ctx, int slot)
{
    if (slot < 0 || slot >= ctx->nslots)
        return -1;
    return ctx->slot_rank ? ctx->slot_rank[slot] : slot < ctx->world0 ? slot : -1;
}

int rec_slot_of(const rk_ctx *ctx, int rank)
{
    if (!ctx->slot_rank)
        return rank;
    for (int s = 0; s < ctx->nslots; s++)
        if (ctx->slot_rank[s] == rank)
            return s;
    return -1;
}

bool rec_join_route(const rk_ctx *ctx, int slot, MPI_Comm *comm, int *rank)
{
    const struct rec_joining *g = ctx->joining;
    if (!g || g->state < J_ADDRESSING || slot < g->slot0 || slot >= g->slot0 + g->n)
        return false;
    *comm = g->comm[0];
    *rank = g->slot_rank[slot];
    return true;
}

/* ---- the members' side -------------------------------------------------------------------- */

static void joining_free(rk_ctx *ctx, const char *why)
{
    struct rec_joining *g = ctx->joining;
    if (!g)
        return;
    if (why) {
        RK_LOG_WARN(RK_SUB_REC, "join of %d worker(s) at slot %d given up: %s; the job goes on at %d", g->n, g->slot0,
                    why, ctx->world);
        /* J17: none started again before every member has given this one up */
        ctx->join_retry_ns = rk__deadline_ns(2 * REC_JOIN_WAIT * ctx->opt.timeout_ms);
    }
    rec_join_end(&g->j);
    for (int i = 0; i < REC_JOIN_COMMS; i++)
        if (g->comm[i] != MPI_COMM_NULL)
            MPI_Comm_free(&g->comm[i]);
    free(g->members);
    free(g->slot_rank);
    free(g->ready);
    free(g);
    ctx->joining = NULL;
}

int rec_join_begin(rk_ctx *ctx, const rec_join_spec *spec)
{
    if (ctx->is_spare || !ctx->det || ctx->rank < 0)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_STATE, "join: only a member of the ring starts a join");
    if (ctx->joining)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_STATE, "join: one is already under way");
    if (!spec || spec->n < 1 || spec->n > 64 || ctx->next_join_slot + spec->n > ctx->nslots)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -EINVAL, "join: %d newcomer(s) do not fit the %d slots left",
                        spec ? spec->n : 0, ctx->nslots - ctx->next_join_slot);
    struct rec_joining *g = calloc(1, sizeof(*g));
    int *ranks = calloc((size_t)ctx->nview, sizeof(int));
    if (!g || !ranks) {
        free(g);
        free(ranks);
        return -ENOMEM;
    }
    for (int i = 0; i < REC_JOIN_COMMS; i++)
        g->comm[i] = MPI_COMM_NULL;
    g->slot0 = ctx->next_join_slot;
    g->n = spec->n;
    ctx->next_join_slot += spec->n; /* J12: alike on every member, given up on or not */
    g->nmembers = ctx->nview;
    g->members = malloc((size_t)ctx->nview * sizeof(int));
    g->slot_rank = malloc((size_t)ctx->nslots * sizeof(int));
    g->ready = calloc((size_t)ctx->nview, sizeof(uint64_t));
    ctx->joining = g;
    if (!g->members || !g->slot_rank || !g->ready) {
        free(ranks);
        joining_free(ctx, NULL);
        return -ENOMEM;
    }
    memcpy(g->members, ctx->view, (size_t)ctx->nview * sizeof(int));
    for (int s = 0; s < ctx->nslots; s++)
        g->slot_rank[s] = -1;
    for (int i = 0; i < g->nmembers; i++) {
        ranks[i] = rec_rank_of(ctx, g->members[i]);
        g->slot_rank[g->members[i]] = i;
    }
    for (int k = 0; k < g->n; k++)
        g->slot_rank[g->slot0 + k] = g->nmembers + k;
    g->since = rk__mono_ns();
    g->deadline = rk__deadline_ns(REC_JOIN_WAIT * ctx->opt.timeout_ms);
    int rc = rec_join_spawn(ctx->comm, ranks, g->nmembers, spec, &g->j);
    free(ranks);
    if (rc) {
        joining_free(ctx, NULL);
        return rc;
    }
    RK_LOG_INFO(RK_SUB_REC, "join: spawning %d worker(s) for slot(s) %d.. (%s)", g->n, g->slot0,
                spec->command ? spec->command : "the command is the first member's");
    RK_EVENT(ctx->ev, "join_started", RK_EV_I("slot", g->slot0), RK_EV_I("n", g->n), RK_EV_I("world", ctx->world));
    return 0;
}

static bool is_m0(const rk_ctx *ctx)
{
    return ctx->joining && ctx->joining->members[0] == ctx->rank0;
}

/* M0's welcome to newcomer k: everything its rk_init needs, over the merged communicator. */
/* A welcome's length: the header, then view, spares and slot_rank (int32), then addrs. */
static size_t welcome_bytes(int nview, int nspares, int nslots)
{
    return sizeof(struct welcome) + ((size_t)nview + (size_t)nspares + (size_t)nslots) * sizeof(int32_t) +
           (size_t)nslots * sizeof(det_addr);
}

static int send_welcome(rk_ctx *ctx, int k)
{
    struct rec_joining *g = ctx->joining;
    size_t len = welcome_bytes(ctx->nview, ctx->nspares, ctx->nslots);
    struct welcome *w = calloc(1, len);
    det_addr *addrs = calloc((size_t)ctx->nslots, sizeof(det_addr));
    int rc = w && addrs ? det_join_info(ctx->det, w->key, w->salt, addrs, &w->view) : -ENOMEM;
    if (!rc) {
        w->magic = JOIN_MAGIC;
        w->slot = g->slot0 + k;
        w->world0 = ctx->world0;
        w->nslots = ctx->nslots;
        w->world = ctx->world;
        w->nview = ctx->nview;
        w->nspares = ctx->nspares;
        w->next_join_slot = ctx->next_join_slot;
        w->agreed_epoch = ctx->agreed_epoch;
        w->nonce = ctx->ckpt_nonce;
        int32_t *v = (int32_t *)(w + 1);
        for (int i = 0; i < ctx->nview; i++)
            *v++ = ctx->view[i];
        for (int i = 0; i < ctx->nspares; i++)
            *v++ = ctx->spares[i];
        for (int s = 0; s < ctx->nslots; s++)
            *v++ = g->slot_rank[s];
        memcpy(v, addrs, (size_t)ctx->nslots * sizeof(det_addr));
        rc = rec_msg_send_on(ctx, g->comm[0], g->nmembers + k, w, len, TAG_WELCOME);
    }
    if (w)
        explicit_bzero(w, sizeof(*w));
    free(w);
    free(addrs);
    return rc;
}

/* The newcomers' addresses, as they come: each one the detector is given, and the newcomer
   joins the list of spares (it is asked in as a spare held back at launch is: recovery.c
   G1-G4). Then g->addr says whose address this member has. */
static void take_addrs(rk_ctx *ctx)
{
    struct rec_joining *g = ctx->joining;
    struct addr a;
    int src, n;
    for (;;) {
        int *sp = realloc(ctx->spares, (size_t)(ctx->nspares + 1) * sizeof(int)); /* room first: */
        if (!sp)
            break; /* nothing received, so nothing lost: a later call takes it */
        ctx->spares = sp;
        if ((n = rec_msg_recv_on(ctx, g->comm[0], TAG_ADDR, &a, sizeof(a), &src, rk__mono_ns() + 100000000LL)) == 0)
            break;
        int k = src - g->nmembers;
        if (n != (int)sizeof(a) || k < 0 || k >= g->n || (g->addr >> k & 1))
            continue;
        ctx->spares[ctx->nspares++] = g->slot0 + k;
        det_set_addr(ctx->det, g->slot0 + k, &a.a);
        det_joiner_knows(ctx->det, g->slot0 + k, a.epoch);
        g->addr |= 1ull << k;
    }
}

static uint64_t every(int n)
{
    return n >= 64 ? ~0ull : (1ull << n) - 1;
}

/* M0: the newcomers whose address every member of the join's view still alive has (the
   READYs that came, its own counted), not asked yet. */
static uint64_t askable(rk_ctx *ctx)
{
    struct rec_joining *g = ctx->joining;
    struct ready r;
    int src, n;
    while ((n = rec_msg_recv(ctx, TAG_READY, &r, sizeof(r), &src, rk__mono_ns() + 100000000LL)) != 0)
        for (int i = 0; n == (int)sizeof(r) && r.magic == JOIN_MAGIC && r.slot0 == g->slot0 && i < g->nmembers; i++)
            if (g->members[i] == src)
                g->ready[i] |= r.have & every(g->n);
    det_view v;
    det_view_get(ctx->det, &v);
    uint64_t can = g->addr & ~g->asked;
    for (int i = 0; i < g->nmembers; i++)
        if (g->members[i] != ctx->rank0 && det_view_has(&v, g->members[i]))
            can &= g->ready[i];
    return can;
}

/* M0: asks in those of `can` (det_admit); true once every newcomer was asked. All at
   once when they all can be; otherwise those that can once the rest ended (J18's records)
   or REC_JOIN_GRACE_MS after the first could (J20). */
static bool ask(rk_ctx *ctx, uint64_t can)
{
    struct rec_joining *g = ctx->joining;
    uint64_t left = every(g->n) & ~g->asked, gone = 0;
    if (!can)
        return !left;
    for (int k = 0; k < g->n && can != left; k++)
        gone |= (uint64_t)((left & ~can) >> k & 1 && rec_record_ended(g->slot0 + k)) << k;
    if (!g->can_since)
        g->can_since = rk__mono_ns();
    if (can != left && (can | gone) != left && rk__ms_since(g->can_since) < REC_JOIN_GRACE_MS)
        return false;
    int asked = 0;
    for (int k = 0; k < g->n; k++) {
        int s = g->slot0 + k;
        if (!(can >> k & 1))
            continue;
        g->asked |= 1ull << k;
        int rc = det_admit(ctx->det, s);
        if (rc) {
            RK_LOG_WARN(RK_SUB_REC, "join: asking slot %d in failed: %s", s, rk_strerror(rc));
            continue;
        }
        ctx->admit[s] = true;
        asked++;
    }
    RK_LOG_INFO(RK_SUB_REC, "join: %d worker(s) asked in from slot %d%s", asked, g->slot0,
                can == left ? "" : " (the others of the join never told where they listen)");
    return can == left;
}

/* ---- the launcher's request (J16, J17) ---------------------------------------------------- */

/* The command of this worker's wrapper under `rekindle run` (`rekindle run --rk-worker DIR
   -- PROGRAM ARGS`: the pid RK_RUN_PARENT names, else the parent), read from /proc, so that
   a newcomer is started as every worker was: its death reported, its end recorded. 0 with
   exe (the wrapper's binary) and *argv (its arguments after argv[0], NULL-ended, pointing
   into *blob; both malloc'd); -ENOENT when there is no such wrapper of this user. */
static int wrapper_command(char *exe, size_t cap, char ***argv, char **blob)
{
    const char *chan = getenv("RK_RUN_PARENT"), *colon = chan ? strchr(chan, ':') : NULL;
    long pid = colon ? strtol(colon + 1, NULL, 10) : (long)getppid();
    char path[64];
    struct stat st;
    *argv = NULL;
    *blob = NULL;
    snprintf(path, sizeof(path), "/proc/%ld", pid);
    if (pid <= 1 || stat(path, &st) != 0 || st.st_uid != geteuid())
        return -ENOENT;
    snprintf(path, sizeof(path), "/proc/%ld/exe", pid);
    ssize_t n = readlink(path, exe, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1)
        return -ENOENT;
    exe[n] = '\0';
    snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t len = 0, lim = 1u << 16;
    char *b = fd >= 0 ? malloc(lim + 1) : NULL;
    while (b && len < lim && (n = read(fd, b + len, lim - len)) > 0)
        len += (size_t)n;
    if (fd >= 0)
        close(fd);
    size_t na = 0;
    for (size_t i = 0; b && i < len; i++)
        na += b[i] == '\0';
    char **a = b && na >= 5 && len < lim ? calloc(na + 1, sizeof(char *)) : NULL;
    if (!a) {
        free(b);
        return -ENOENT;
    }
    b[len] = '\0';
    for (size_t i = 0, k = 0; k < na; i += strlen(b + i) + 1)
        a[k++] = b + i;
    if (strcmp(a[1], "run") != 0 || strcmp(a[2], "--rk-worker") != 0 || strcmp(a[4], "--") != 0) {
        free(a);
        free(b);
        return -ENOENT;
    }
    memmove(a, a + 1, na * sizeof(char *)); /* argv[0] is the command's, MPI_Comm_spawn's to give */
    *argv = a;
    *blob = b;
    return 0;
}

/* The hosts of the next newcomers from the grow file's join lines ("join" or "join HOST"):
   the last `more` of them (the earlier ones asked for workers that joined since), at most
   JOIN_HOSTS; each host[k] a string in text ("" where the line names none, or not a host
   name: wherever mpirun has a slot). How many: 0 when the file has none (a growth onto
   spares alone). */
static int join_lines(char *text, int more, const char *host[JOIN_HOSTS])
{
    char *lines[JOIN_HOSTS];
    int n = 0, k = 0;
    for (char *l = strchr(text, '\n'); l && n < JOIN_HOSTS; l = strchr(l, '\n')) {
        *l++ = '\0';
        if (strncmp(l, "join", 4) == 0 && (l[4] == '\n' || l[4] == ' ' || l[4] == '\0'))
            lines[n++] = l + 4;
    }
    for (int i = more < n ? n - more : 0; i < n; i++) {
        char *l = lines[i] + strspn(lines[i], " ");
        size_t len = strcspn(l, " \n");
        if (len > 255 || strspn(l, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:") < len)
            len = 0;
        l[len] = '\0'; /* the line's end, or a space before it: nothing read after */
        host[k++] = l;
    }
    return k;
}

/* M0: the launcher asks for a larger world than the members and the spares waiting make,
   with join lines: every other member is told to start the same join (START, the agreed
   epoch), and M0 starts it, the newcomer under the wrapper every worker has. */
static void request_poll(rk_ctx *ctx)
{
    int64_t now = rk__mono_ns();
    if (ctx->rank != 0 || ctx->is_spare || !ctx->det || !ctx->grow_file || now < ctx->join_poll_ns ||
        now < ctx->join_retry_ns)
        return;
    ctx->join_poll_ns = now + REC_GROW_POLL_NS;
    char text[4096], exe[4096], **argv = NULL, *blob = NULL;
    const char *host[JOIN_HOSTS];
    if (rec_grow_read(ctx, text, sizeof(text)) <= 0)
        return;
    det_view v;
    det_view_get(ctx->det, &v);
    int want = rec_grow_world(text), more = want - ctx->world, n;
    for (int i = 0; i < ctx->nspares; i++)
        more -= det_view_has(&v, ctx->spares[i]); /* rec_grow_poll asks them (G2) */
    if (more <= 0 || (n = join_lines(text, more, host)) == 0)
        return;
    if (n > ctx->nslots - ctx->next_join_slot)
        n = ctx->nslots - ctx->next_join_slot;
    if (n < 1) {
        RK_LOG_WARN(RK_SUB_REC, "growth to %d asks for workers started while the job runs, but the job's %d slots "
                    "for them are spent: not started", want, RK_JOIN_SLOTS);
        ctx->join_retry_ns = INT64_MAX;
        return;
    }
    if (wrapper_command(exe, sizeof(exe), &argv, &blob) != 0) {
        RK_LOG_WARN(RK_SUB_REC, "growth to %d asks for a worker started while the job runs, but this worker was not "
                    "started by `rekindle run` (no wrapper to start it the same way): not started", want);
        ctx->join_retry_ns = INT64_MAX;
        return;
    }
    int slot0 = ctx->next_join_slot;
    struct start m = {JOIN_MAGIC, slot0, n, 0, ctx->agreed_epoch};
    for (int i = 0; i < ctx->nview; i++)
        if (ctx->view[i] != ctx->rank0)
            rec_msg_send(ctx, &m, sizeof(m), ctx->view[i], TAG_START);
    char envs[JOIN_HOSTS][128], on[512] = "";
    const char *env[JOIN_HOSTS];
    bool ports = !getenv("OMPI_MCA_btl_tcp_port_min_v4"); /* J22: the user's own setting is kept */
    size_t ol = 0;
    for (int k = 0; k < n; k++) {
        int s = slot0 + k, port = REC_JOIN_PORT0 + (REC_JOIN_PORT_STEP * s) % (65536 - 2 * REC_JOIN_PORT0);
        if (ports) /* its wrapper's records are the slot's; its ports, the slot's (J22) */
            snprintf(envs[k], sizeof(envs[k]),
                     "RK_RUN_SLOT=%d\nOMPI_MCA_btl_tcp_port_min_v4=%d\nOMPI_MCA_btl_tcp_port_min_v6=%d", s, port, port);
        else
            snprintf(envs[k], sizeof(envs[k]), "RK_RUN_SLOT=%d", s);
        env[k] = envs[k];
        if (ol < sizeof(on))
            ol += (size_t)snprintf(on + ol, sizeof(on) - ol, "%s%s", k ? ", " : "", host[k][0] ? host[k] : "any host");
    }
    rec_join_spec spec = {.command = exe, .argv = argv, .n = n, .hosts = host, .env = env};
    int rc = rec_join_begin(ctx, &spec);
    free(argv);
    free(blob);
    if (rc) {
        ctx->join_retry_ns = rk__deadline_ns(2 * REC_JOIN_WAIT * ctx->opt.timeout_ms);
        return;
    }
    RK_LOG_INFO(RK_SUB_REC, "growth to %d asked (%s): %d worker(s) started at slot %d.. on %s", want, ctx->grow_file,
                n, slot0, on);
}

/* Every other member: M0's START, taken at rk_step_done; one of another agreed view, or
   for slots behind this member's, is dropped (M0's join then ends at its bound). */
static void start_poll(rk_ctx *ctx)
{
    struct start m;
    int src, n;
    if (ctx->is_spare || ctx->rank < 0 || !ctx->det)
        return;
    while ((n = rec_msg_recv(ctx, TAG_START, &m, sizeof(m), &src, rk__mono_ns() + 100000000LL)) != 0) {
        if (n != (int)sizeof(m) || m.magic != JOIN_MAGIC || m.n < 1 || m.n > JOIN_HOSTS || m.epoch != ctx->agreed_epoch ||
            ctx->nview < 1 || src != ctx->view[0] || m.slot0 < ctx->next_join_slot || ctx->joining) {
            RK_LOG_INFO(RK_SUB_REC, "join: a request from slot %d dropped (another view, or a join under way)", src);
            continue;
        }
        ctx->next_join_slot = m.slot0; /* J12: the slots M0 gave up on are skipped alike */
        rec_join_spec spec = {.n = m.n};
        int rc = rec_join_begin(ctx, &spec);
        if (rc)
            RK_LOG_WARN(RK_SUB_REC, "join: starting the join M0 asked for failed: %s", rk_strerror(rc));
    }
}

/* The spawn or the merge failed (an MPI error, not a death the records show): given up,
   and M0 tells the launcher why (J19), so that it grows by a relaunch at once instead of
   at its bound. Open MPI 4.1's spawn fails this way when a newcomer is alive but reaches
   MPI_Init after the spawn's PMIx exchange bound (common/mpi.c), e.g. a Python program
   importing torch on a busy host: trying again would fail alike. */
static void spawn_failed(rk_ctx *ctx, int rc)
{
    struct rec_joining *g = ctx->joining;
    char why[512];
    const char *set = getenv("OMPI_MCA_pmix_base_exchange_timeout");
    int alive = 0;
    for (int k = 0; k < g->n; k++)
        alive += !rec_record_ended(g->slot0 + k);
    if (alive)
        snprintf(why, sizeof(why), "the spawn failed %.1f s after the join began, the newcomer still starting: a "
                 "worker started to join must reach MPI_Init within the spawn's PMIx exchange bound (%d s from "
                 "RK_TIMEOUT_MS=%d; OMPI_MCA_pmix_base_exchange_timeout=%s)",
                 (double)(rk__mono_ns() - g->since) / 1e9, rk__mpi_exchange_wait_s(ctx->opt.timeout_ms),
                 ctx->opt.timeout_ms, set ? set : "unset");
    else
        snprintf(why, sizeof(why), "%s", rk_strerror(rc));
    for (int k = 0; alive && is_m0(ctx) && k < g->n; k++) {
        int wrc = rec_record_note("unjoined", g->slot0 + k, why);
        if (wrc)
            RK_LOG_WARN(RK_SUB_REC, "cannot tell the launcher why the join failed: %s", strerror(-wrc));
    }
    joining_free(ctx, why);
}

void rec_join_progress(rk_ctx *ctx)
{
    struct rec_joining *g = ctx->joining;
    if (!g) {
        request_poll(ctx);
        start_poll(ctx);
        return;
    }
    int64_t span = REC_JOIN_WAIT * (int64_t)ctx->opt.timeout_ms * 1000000LL;
    bool late = rk__mono_ns() > g->deadline + (is_m0(ctx) ? 0 : span);
    int rc;
    switch (g->state) {
    case J_SPAWNING:
        rc = rec_join_poll(g->j, g->comm);
        if (rc == REC_AGAIN) {
            int64_t now = rk__mono_ns();
            bool look = !late && now >= g->look_ns;
            if (look)
                g->look_ns = now + REC_GROW_POLL_NS;
            for (int k = 0; look && k < g->n; k++)
                if (rec_record_ended(g->slot0 + k)) { /* J18 */
                    joining_free(ctx, "the newcomer ended before its spawn and merge returned (its wrapper's record)");
                    return;
                }
            if (late)
                joining_free(ctx, "the spawn and merge did not return in time");
            return;
        }
        rec_join_end(&g->j);
        if (rc) {
            spawn_failed(ctx, rc);
            return;
        }
        g->state = J_ADDRESSING;
        RK_LOG_INFO(RK_SUB_REC, "join: %d worker(s) merged in", g->n);
        for (int k = 0; is_m0(ctx) && k < g->n; k++)
            if ((rc = send_welcome(ctx, k)) != 0) {
                joining_free(ctx, "the welcome could not be sent");
                return;
            }
        /* fall through */
    case J_ADDRESSING: {
        take_addrs(ctx);
        if (!is_m0(ctx)) {
            if (g->addr != g->told) {
                struct ready r = {JOIN_MAGIC, g->slot0, g->addr};
                if (rec_msg_send(ctx, &r, sizeof(r), g->members[0], TAG_READY) == 0)
                    g->told = g->addr;
            }
            if (g->addr == every(g->n))
                g->state = J_ASKED;
            else if (late)
                joining_free(ctx, "a newcomer never said where its detector listens");
            return;
        }
        if (late) /* M0 asks only before its deadline (J14) */
            joining_free(ctx, g->asked ? "no decision brought the newcomers in"
                                       : "not every member got the newcomers in time");
        else if (ask(ctx, askable(ctx)))
            g->state = J_ASKED;
        return;
    }
    case J_ASKED:
        if (late)
            joining_free(ctx, "no decision brought the newcomers in");
        return;
    }
}

int rec_join_switch(rk_ctx *ctx, const int *members, int nmembers, int *ranks, MPI_Comm *ring_comm)
{
    struct rec_joining *g = ctx->joining;
    *ring_comm = MPI_COMM_NULL;
    bool any = false;
    for (int i = 0; g && g->state >= J_ADDRESSING && i < nmembers; i++)
        any |= members[i] >= g->slot0 && members[i] < g->slot0 + g->n && (g->addr >> (members[i] - g->slot0) & 1);
    for (int i = 0; i < nmembers; i++)
        ranks[i] = any ? g->slot_rank[members[i]] : rec_rank_of(ctx, members[i]);
    if (!any)
        return 0;
    for (int i = 0; i < nmembers; i++)
        if (ranks[i] < 0)
            return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "join: slot %d is not in the merged communicator",
                            members[i]);
    /* J15: from here on this member's recovery talks on the merged communicator. */
    MPI_Comm_free(&ctx->comm);
    ctx->comm = g->comm[0];
    *ring_comm = g->comm[1];
    g->comm[0] = g->comm[1] = MPI_COMM_NULL;
    free(ctx->slot_rank);
    ctx->slot_rank = g->slot_rank;
    g->slot_rank = NULL;
    joining_free(ctx, NULL);
    return 0;
}

void rec_join_fini(rk_ctx *ctx)
{
    joining_free(ctx, NULL);
}

/* ---- the newcomer's side (rk_init) ------------------------------------------------------- */

/* The members' welcome (from M0, rank 0 of the merged communicator), polled until the
   deadline: 0 and *out (malloc'd), or RK_E_TIMEOUT. */
static int wait_welcome(rk_ctx *ctx, struct welcome **out, size_t *len, int64_t deadline)
{
    /* the longest a welcome can be: every slot in the view, the spares and the map */
    size_t cap = welcome_bytes(DET_MAX_SLOTS, DET_MAX_SLOTS, DET_MAX_SLOTS);
    struct welcome *w = malloc(cap);
    if (!w)
        return -ENOMEM;
    for (;;) {
        int src, n = rec_msg_recv_on(ctx, ctx->comm, TAG_WELCOME, w, cap, &src, deadline);
        if (n >= (int)sizeof(*w) && w->magic == JOIN_MAGIC) {
            *out = w;
            *len = (size_t)n;
            return 0;
        }
        if (rk__deadline_passed(deadline)) {
            free(w);
            return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_TIMEOUT, "rk_init: joining the job: no welcome from its "
                            "members in time");
        }
        rk__sleep_ns(REC_POLL_NS);
    }
}

int rec_join_arrive(rk_ctx *ctx, MPI_Comm parent, MPI_Comm *ring_comm, struct rec_join_welcome **out)
{
    struct rec_join *j = NULL;
    MPI_Comm c[REC_JOIN_COMMS];
    int64_t deadline = rk__deadline_ns(REC_JOIN_WAIT * ctx->opt.timeout_ms);
    *out = NULL;
    int rc = rec_join_newcomer(parent, &j);
    while (!rc && (rc = rec_join_poll(j, c)) == REC_AGAIN) {
        rc = 0;
        if (rk__deadline_passed(deadline)) {
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_TIMEOUT, "rk_init: joining the job: the merge with its "
                          "members did not return in time");
            break;
        }
        rk__sleep_ns(REC_POLL_NS);
    }
    rec_join_end(&j);
    if (rc)
        return rc;
    ctx->comm = c[0];
    *ring_comm = c[1];
    struct welcome *w = NULL;
    size_t len = 0;
    if ((rc = wait_welcome(ctx, &w, &len, deadline)) != 0)
        return rc;
    if (w->nslots < 1 || w->nslots > DET_MAX_SLOTS || w->nview < 1 || w->nspares < 0 || w->slot < w->world0 ||
        w->slot >= w->nslots || len != welcome_bytes(w->nview, w->nspares, w->nslots)) {
        free(w);
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rk_init: joining the job: a malformed welcome");
    }
    *out = (struct rec_join_welcome *)w;
    return 0;
}

int rec_join_welcome_apply(rk_ctx *ctx, struct rec_join_welcome *wp)
{
    struct welcome *w = (struct welcome *)wp;
    int32_t *v = (int32_t *)(w + 1);
    ctx->rank0 = w->slot;
    ctx->world0 = w->world0;
    ctx->nslots = w->nslots;
    ctx->world = w->world;
    ctx->next_join_slot = w->next_join_slot;
    ctx->agreed_epoch = w->agreed_epoch;
    ctx->ckpt_nonce = w->nonce;
    ctx->is_spare = true;
    ctx->rank = -1;
    ctx->host_ranks = 1;
    ctx->nview = w->nview;
    ctx->view = malloc((size_t)w->nview * sizeof(int));
    ctx->spares = malloc((size_t)(w->nspares + 1) * sizeof(int));
    ctx->slot_rank = malloc((size_t)w->nslots * sizeof(int));
    ctx->admit = calloc((size_t)w->nslots, sizeof(bool));
    if (!ctx->view || !ctx->spares || !ctx->slot_rank || !ctx->admit)
        return -ENOMEM;
    for (int i = 0; i < w->nview; i++)
        ctx->view[i] = *v++;
    ctx->nspares = 0;
    for (int i = 0; i < w->nspares; i++)
        ctx->spares[ctx->nspares++] = *v++;
    for (int s = 0; s < w->nslots; s++)
        ctx->slot_rank[s] = *v++;
    return 0;
}

/* Slot s is another newcomer of this one's join: it has a rank in the merged communicator
   (the welcome's map) and is neither a member of the view nor this newcomer. */
static bool is_peer(const struct welcome *w, int s)
{
    const int32_t *v = (const int32_t *)(w + 1), *slot_rank = v + w->nview + w->nspares;
    if (s == w->slot || slot_rank[s] < 0)
        return false;
    for (int i = 0; i < w->nview; i++)
        if (v[i] == s)
            return false;
    return true;
}

void rec_join_peers_poll(rk_ctx *ctx)
{
    if (!ctx->det || ctx->peers_have == ctx->peers_want)
        return;
    struct addr a;
    int src, n;
    while ((n = rec_msg_recv(ctx, TAG_ADDR, &a, sizeof(a), &src, rk__mono_ns() + 100000000LL)) != 0) {
        int k = src - ctx->peers_slot0;
        if (n != (int)sizeof(a) || k < 0 || k >= 64 || !(ctx->peers_want >> k & 1) || (ctx->peers_have >> k & 1))
            continue;
        det_set_addr(ctx->det, src, &a.a);
        ctx->peers_have |= 1ull << k;
    }
    if (ctx->peers_have == ctx->peers_want)
        RK_LOG_INFO(RK_SUB_REC, "join: the other worker(s) started with this one told where they listen");
}

int rec_join_det_start(rk_ctx *ctx, struct rec_join_welcome *wp, const det_cfg *base)
{
    struct welcome *w = (struct welcome *)wp;
    /* The addresses follow the int32 lists, 4-byte aligned where their count is odd: copied
       out before they are read as det_addr (8-byte aligned; UBSan caught the read). */
    det_addr *addrs = malloc((size_t)w->nslots * sizeof(det_addr));
    if (!addrs)
        return -ENOMEM;
    memcpy(addrs, (const int32_t *)(w + 1) + w->nview + w->nspares + w->nslots, (size_t)w->nslots * sizeof(det_addr));
    det_view v0 = w->view;
    v0.members[w->slot / 64] |= 1ull << (w->slot % 64);
    v0.nmembers++;
    det_cfg cfg = *base;
    cfg.rank = w->slot;
    cfg.world = cfg.nslots = w->nslots;
    cfg.view0 = &v0;
    int rc = det_open(&ctx->det, &cfg);
    if (rc) {
        free(addrs);
        return rc;
    }
    struct addr mine = {.epoch = w->view.epoch};
    det_local_addr(ctx->det, &mine.a);
    for (int i = 0; i < ctx->nview && !rc; i++) /* where this one listens, to every member (J14) */
        rc = rec_msg_send(ctx, &mine, sizeof(mine), ctx->view[i], TAG_ADDR);
    ctx->peers_slot0 = -1;
    ctx->peers_want = ctx->peers_have = 0;
    for (int s = 0; s < w->nslots && rc >= 0; s++) /* and to the other newcomers of its join (J20) */
        if (is_peer(w, s)) {
            if (ctx->peers_slot0 < 0)
                ctx->peers_slot0 = s; /* a join's slots are consecutive (J12) */
            if (s - ctx->peers_slot0 < 64)
                ctx->peers_want |= 1ull << (s - ctx->peers_slot0);
            rc = rec_msg_send(ctx, &mine, sizeof(mine), s, TAG_ADDR);
        }
    if (rc >= 0)
        rc = det_start(ctx->det, addrs, w->key, w->salt);
    free(addrs);
    explicit_bzero(w->key, sizeof(w->key));
    if (rc >= 0)
        rec_join_peers_poll(ctx);
    if (rc)
        det_close(&ctx->det);
    return rc < 0 ? rc : 0;
}

void rec_join_welcome_free(struct rec_join_welcome **wp)
{
    if (*wp)
        explicit_bzero(*wp, sizeof(struct welcome));
    free(*wp);
    *wp = NULL;
}
