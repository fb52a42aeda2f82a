/*
 * bench/mpi_connect_probe.c - whether a newcomer reached by connect/accept over
 * MPI_COMM_SELF (one intercommunicator per pair, no merge) can be given up on in bounded
 * time when it dies (growth in place onto processes started later, docs/LAUNCHER.md "Why a
 * job grows by a relaunch"; the spawn and merge are bench/mpi_grow_probe.c's). Run under
 * `mpirun --enable-recovery --mca orte_abort_on_non_zero_status 0 -n 3
 * bench/mpi_connect_probe MODE` (bench/grow_probe.sh runs the three): rank 0 spawns one newcomer on MPI_COMM_SELF; the newcomer opens a port and
 * sends its name to rank 0 over the spawn's intercommunicator; rank 0 hands it to ranks 1
 * and 2, which MPI_Comm_connect on MPI_COMM_SELF while the newcomer MPI_Comm_accepts on
 * MPI_COMM_SELF twice; then every member exchanges a token with it by nonblocking
 * point-to-point, polled against a 3 s deadline. MODE:
 *   ok      the newcomer lives;
 *   early   it dies after sending the port's name, before any accept;
 *   middle  it dies after its first accept (one connect done, the other not).
 * And the spawn made by every member together (MPI_Comm_spawn over MPI_COMM_WORLD: each
 * member gets the intercommunicator), then a token between each member and the newcomer:
 *   group         the newcomer lives;
 *   group-dies    it dies right after MPI_Init;
 *   group-noinit  it exits before MPI_Init (a program that fails at its start);
 *   thread        each member spawns a newcomer of its own on a thread (MPI_THREAD_MULTIPLE)
 *                 while its main thread exchanges tokens with the other members, 3 s;
 *   thread-noinit the same spawn on a thread of each member's own (MPI_THREAD_MULTIPLE),
 *                 the newcomer gone before MPI_Init: does MPI go on beside a spawn that
 *                 never returns?
 * And the spawn by every member together followed by MPI_Intercomm_merge, both on a
 * thread of each member (MPI_THREAD_MULTIPLE), while the main threads pass tokens around
 * the members' ring; given up on at 3 s if not returned; then, if merged, tokens around
 * the merged ring of members and newcomer; last, MPI_Finalize (a 15 s bound), skipped
 * where the thread was given up on (PROBE_FINALIZE_ANYWAY=1 calls it even then):
 *   merge         the newcomer lives (and ends after its rounds of the merged ring);
 *   merge-dies    it dies after MPI_Init, before the merge;
 *   merge-noinit  it exits before MPI_Init.
 * Each call's result and time are printed; a call still blocked after 15 s prints
 * "HANG in CALL" and the process exits 9 (SIGALRM), which is the answer for that call.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *volatile in_call = "start";
static int me = -1;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void on_alarm(int sig)
{
    (void)sig;
    char b[128];
    int n = snprintf(b, sizeof b, "rank %d: HANG in %s (15 s)\n", me, in_call);
    if (write(1, b, (size_t)n) < 0)
        _exit(9);
    _exit(9);
}

/* A token to peer `to` of `c` and one from peer `from`, nonblocking, polled until 3 s:
   "done", "error N" or "timed out" (then both requests are abandoned: cancelled and
   freed). */
static const char *pass(MPI_Comm c, int to, int from, double *ms)
{
    int out = 7, in = 0, done = 0;
    MPI_Request q[2];
    double t0 = now_ms();
    int rc = MPI_Isend(&out, 1, MPI_INT, to, 5, c, &q[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Irecv(&in, 1, MPI_INT, from, 5, c, &q[1]);
    static char why[64];
    while (rc == MPI_SUCCESS && !done && now_ms() - t0 < 3000)
        rc = MPI_Testall(2, q, &done, MPI_STATUSES_IGNORE);
    *ms = now_ms() - t0;
    if (rc != MPI_SUCCESS) {
        snprintf(why, sizeof why, "error %d", rc);
        return why;
    }
    if (!done) {
        for (int k = 0; k < 2; k++)
            if (q[k] != MPI_REQUEST_NULL) {
                MPI_Cancel(&q[k]);
                MPI_Request_free(&q[k]);
            }
        return "timed out (abandoned)";
    }
    return in == 7 ? "done" : "done, wrong token";
}

/* A token both ways with peer `r` of `c` (pass). */
static const char *exchange(MPI_Comm c, int r, double *ms)
{
    return pass(c, r, r, ms);
}

struct spawn_job {
    char *argv0;
    const char *mode;
    MPI_Comm inter, merged;
    volatile int done;
};

static MPI_Comm spawn(char *argv0, const char *mode, MPI_Comm over, const char *how);

static void *spawn_main(void *arg)
{
    struct spawn_job *j = arg;
    MPI_Comm self;
    MPI_Comm_dup(MPI_COMM_SELF, &self); /* each member spawns alone: no collective among them */
    j->inter = spawn(j->argv0, j->mode, self, "alone, on a thread");
    j->done = 1;
    return NULL;
}

/* thread, thread-noinit: the spawn on a thread; tokens around the members' ring
   meanwhile (100,000 rounds, or 3 s); then the spawn given up on if it has not returned
   (the thread is left). */
static void spawn_on_thread(char *argv0, const char *mode)
{
    static struct spawn_job j;
    j = (struct spawn_job){.argv0 = argv0, .mode = mode, .inter = MPI_COMM_NULL};
    pthread_t t;
    pthread_create(&t, NULL, spawn_main, &j);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double t0 = now_ms(), ms;
    int rounds = 0;
    while (rounds < 100000 && now_ms() - t0 < 3000) { /* the ring is in step: all stop at once */
        const char *how = pass(MPI_COMM_WORLD, (me + 1) % size, (me + size - 1) % size, &ms); /* a ring */
        if (strcmp(how, "done") != 0) {
            printf("rank %d: token among the members beside the spawn: %s\n", me, how);
            break;
        }
        rounds++;
    }
    double t1 = now_ms();
    while (!j.done && now_ms() - t0 < 3000)
        usleep(1000);
    printf("rank %d: %d token rounds among the members in %.1f ms beside the spawn; spawn %s at %.1f ms\n", me,
           rounds, t1 - t0, j.done ? "returned" : "given up on (its thread left)", now_ms() - t0);
    t1 = now_ms();
    for (rounds = 0; rounds < 100000 && now_ms() - t1 < 3000; rounds++)
        if (strcmp(pass(MPI_COMM_WORLD, (me + 1) % size, (me + size - 1) % size, &ms), "done") != 0)
            break;
    printf("rank %d: then %d more in %.1f ms\n", me, rounds, now_ms() - t1);
    fflush(stdout);
    pthread_detach(t);
}

/* merge*: the members' spawn and merge, on a thread of each */
static void *merge_main(void *arg)
{
    struct spawn_job *j = arg;
    MPI_Comm members;
    MPI_Comm_dup(MPI_COMM_WORLD, &members);
    j->inter = spawn(j->argv0, j->mode, members, "by every member, on a thread");
    if (j->inter != MPI_COMM_NULL) {
        double t0 = now_ms();
        int rc = MPI_Intercomm_merge(j->inter, 0, &j->merged);
        printf("rank %d: merge rc %d in %.1f ms (on the thread)\n", me, rc, now_ms() - t0);
        fflush(stdout);
        if (rc == MPI_SUCCESS)
            MPI_Comm_set_errhandler(j->merged, MPI_ERRORS_RETURN);
    }
    j->done = 1;
    return NULL;
}

/* Tokens around the ring of c for up to 100,000 rounds or 3 s: the rounds done and how
   the last ended. */
static int ring_rounds(MPI_Comm c, const char **how, double *ms)
{
    int size, r, rounds = 0;
    MPI_Comm_size(c, &size);
    MPI_Comm_rank(c, &r);
    double t0 = now_ms(), one;
    *how = "done";
    while (rounds < 100000 && now_ms() - t0 < 3000) {
        *how = pass(c, (r + 1) % size, (r + size - 1) % size, &one);
        if (strcmp(*how, "done") != 0)
            break;
        rounds++;
    }
    *ms = now_ms() - t0;
    return rounds;
}

static void merge_on_thread(char *argv0, const char *mode)
{
    static struct spawn_job j;
    j = (struct spawn_job){.argv0 = argv0, .mode = mode, .inter = MPI_COMM_NULL, .merged = MPI_COMM_NULL};
    pthread_t t;
    pthread_create(&t, NULL, merge_main, &j);
    const char *how;
    double ms, t0 = now_ms();
    int rounds = ring_rounds(MPI_COMM_WORLD, &how, &ms);
    while (!j.done && now_ms() - t0 < 3000)
        usleep(1000);
    printf("rank %d: %d token rounds among the members in %.1f ms (%s) beside the spawn and merge; they %s at "
           "%.1f ms\n", me, rounds, ms, how, j.done ? "returned" : "were given up on (the thread left)",
           now_ms() - t0);
    if (j.done && j.merged != MPI_COMM_NULL) {
        rounds = ring_rounds(j.merged, &how, &ms);
        printf("rank %d: %d token rounds around the merged ring in %.1f ms (%s)\n", me, rounds, ms, how);
    } else {
        rounds = ring_rounds(MPI_COMM_WORLD, &how, &ms);
        printf("rank %d: then %d token rounds among the members in %.1f ms (%s)\n", me, rounds, ms, how);
    }
    fflush(stdout);
    pthread_detach(t);
    if (!j.done && !getenv("PROBE_FINALIZE_ANYWAY")) {
        /* MPI_Finalize under a thread still inside the merge: that thread's progress
           engine touches the shared-memory transport the finalize takes down (a segfault
           in 1 of 2 runs of merge-dies). The process ends without it, as a program would. */
        printf("rank %d: MPI_Finalize skipped: a thread is still inside MPI\n", me);
        fflush(stdout);
        exit(0);
    }
    alarm(15);
    in_call = "MPI_Finalize";
    t0 = now_ms();
    int rc = MPI_Finalize();
    alarm(0);
    printf("rank %d: MPI_Finalize rc %d in %.1f ms\n", me, rc, now_ms() - t0);
    fflush(stdout);
}

/* One newcomer, argv0 MODE child, spawned by the members of `over` together (how: said
   so); their intercommunicator with it (MPI_COMM_NULL if the spawn failed). */
static MPI_Comm spawn(char *argv0, const char *mode, MPI_Comm over, const char *how)
{
    char *cargv[] = {(char *)mode, "child", NULL};
    int errs[1] = {0};
    MPI_Comm inter = MPI_COMM_NULL;
    alarm(15);
    in_call = "MPI_Comm_spawn";
    double t0 = now_ms();
    int rc = MPI_Comm_spawn(argv0, cargv, 1, MPI_INFO_NULL, 0, over, &inter, errs);
    alarm(0);
    printf("rank %d: spawn (%s) rc %d, the newcomer's %d, in %.1f ms\n", me, how, rc, errs[0], now_ms() - t0);
    fflush(stdout);
    if (rc != MPI_SUCCESS)
        return MPI_COMM_NULL;
    MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    return inter;
}

int main(int argc, char **argv)
{
    int prov;
    signal(SIGALRM, on_alarm);
    if (argc > 2 && strstr(argv[1], "-noinit")) /* the newcomer: argv[2] "child" */
        _exit(1);
    bool merging = strncmp(argc > 1 ? argv[1] : "", "merge", 5) == 0;
    bool threaded = strncmp(argc > 1 ? argv[1] : "", "thread", 6) == 0 || merging;
    if (merging)
        setenv("OMPI_MCA_async_mpi_finalize", "1", 0); /* as rk_init: no final barrier */
    MPI_Init_thread(&argc, &argv, threaded ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, &prov);
    if (threaded && prov < MPI_THREAD_MULTIPLE) {
        printf("no MPI_THREAD_MULTIPLE (%d)\n", prov);
        _exit(2);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    const char *mode = argc > 1 ? argv[1] : "ok";
    char port[MPI_MAX_PORT_NAME] = "";
    double ms;
    if (parent != MPI_COMM_NULL && merging) { /* merge*: the newcomer */
        me = 99;
        MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
        if (strcmp(mode, "merge-dies") == 0)
            raise(SIGKILL);
        MPI_Comm merged;
        int rc = MPI_Intercomm_merge(parent, 1, &merged);
        printf("newcomer: merge rc %d\n", rc);
        if (rc == MPI_SUCCESS) {
            MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
            const char *how;
            int rounds = ring_rounds(merged, &how, &ms);
            printf("newcomer: %d token rounds around the merged ring in %.1f ms (%s)\n", rounds, ms, how);
        }
        fflush(stdout);
        MPI_Finalize();
        return 0;
    }
    if (parent != MPI_COMM_NULL && threaded) /* thread: a newcomer that lives, and is not used */
        _exit(0);
    if (parent != MPI_COMM_NULL && strncmp(mode, "group", 5) == 0) { /* the group's newcomer */
        me = 99;
        MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
        if (strcmp(mode, "group-dies") == 0)
            raise(SIGKILL);
        int n;
        MPI_Comm_remote_size(parent, &n);
        for (int r = 0; r < n; r++)
            printf("newcomer: with member %d: %s\n", r, exchange(parent, r, &ms));
        fflush(stdout);
        _exit(0);
    }
    if (parent != MPI_COMM_NULL) { /* the newcomer */
        me = 99;
        MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
        MPI_Open_port(MPI_INFO_NULL, port);
        MPI_Send(port, MPI_MAX_PORT_NAME, MPI_CHAR, 0, 1, parent);
        if (strcmp(mode, "early") == 0) {
            usleep(200000);
            raise(SIGKILL);
        }
        MPI_Comm c[2];
        for (int k = 0; k < 2; k++) {
            alarm(15);
            in_call = "MPI_Comm_accept";
            double t0 = now_ms();
            int rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &c[k]);
            alarm(0);
            printf("newcomer: accept %d rc %d in %.1f ms\n", k, rc, now_ms() - t0);
            fflush(stdout);
            MPI_Comm_set_errhandler(c[k], MPI_ERRORS_RETURN);
            if (k == 0 && strcmp(mode, "middle") == 0)
                raise(SIGKILL);
        }
        printf("newcomer: with rank 0: %s\n", exchange(parent, 0, &ms));
        for (int k = 0; k < 2; k++)
            printf("newcomer: with connection %d: %s\n", k, exchange(c[k], 0, &ms));
        fflush(stdout);
        MPI_Finalize();
        return 0;
    }
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm inter = MPI_COMM_NULL;
    if (merging) {
        merge_on_thread(argv[0], mode);
        _exit(0);
    } else if (threaded) {
        spawn_on_thread(argv[0], mode);
        _exit(0);
    } else if (strncmp(mode, "group", 5) == 0) {
        inter = spawn(argv[0], mode, MPI_COMM_WORLD, "by every member");
    } else if (me == 0) {
        inter = spawn(argv[0], mode, MPI_COMM_SELF, "alone");
        MPI_Request q;
        int done = 0;
        double t0 = now_ms();
        MPI_Irecv(port, MPI_MAX_PORT_NAME, MPI_CHAR, 0, 1, inter, &q);
        while (!done && now_ms() - t0 < 3000)
            MPI_Test(&q, &done, MPI_STATUS_IGNORE);
        printf("rank 0: port name %s in %.1f ms\n", done ? "received" : "NOT received", now_ms() - t0);
        fflush(stdout);
        for (int r = 1; r < size; r++)
            MPI_Send(port, MPI_MAX_PORT_NAME, MPI_CHAR, r, 2, MPI_COMM_WORLD);
    } else {
        MPI_Recv(port, MPI_MAX_PORT_NAME, MPI_CHAR, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        usleep(me == 2 ? 500000 : 0); /* rank 1 first: "middle" dies between the two */
        MPI_Comm c;
        alarm(15);
        in_call = "MPI_Comm_connect";
        double t0 = now_ms();
        int rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &c);
        alarm(0);
        printf("rank %d: connect rc %d in %.1f ms\n", me, rc, now_ms() - t0);
        fflush(stdout);
        if (rc == MPI_SUCCESS) {
            MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
            inter = c;
        }
    }
    if (inter != MPI_COMM_NULL) {
        const char *how = exchange(inter, 0, &ms);
        printf("rank %d: token with the newcomer: %s in %.1f ms\n", me, how, ms);
        fflush(stdout);
    }
    /* the members among themselves still work: a nonblocking barrier, polled */
    MPI_Request b;
    int done = 0;
    double t0 = now_ms();
    MPI_Ibarrier(MPI_COMM_WORLD, &b);
    while (!done && now_ms() - t0 < 3000)
        MPI_Test(&b, &done, MPI_STATUS_IGNORE);
    printf("rank %d: barrier of the members %s in %.1f ms\n", me, done ? "done" : "NOT done", now_ms() - t0);
    fflush(stdout);
    _exit(0); /* MPI_Finalize after a failure may hang (shared/NOTES-mpi.md): not its question */
}
