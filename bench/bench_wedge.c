/*
 * bench/bench_wedge.c - what becomes of a survivor when its peer is SIGKILLed in the middle
 * of a transfer, under one of Open MPI's transports (docs/RING.md, "Transport"). Two ranks
 * under mpirun; rank 1 is the victim, killed by a timer thread 50-150 ms in, at whatever
 * instruction it is running (a kill from the same thread would only land at a system call).
 *   bench_wedge recv [BYTES]   rank 1 floods rank 0 with messages; rank 0 receives
 *   bench_wedge send [BYTES]   rank 0 floods rank 1 with messages; rank 1 receives
 * Rank 0, the survivor, polls with non-blocking calls only, for 1.5 s (send) or until 1 s
 * without a message (recv), and prints "survived". A watchdog thread prints "wedged" and
 * exits 3 if one MPI call has not returned for 3 s. If Open MPI aborts it, nothing is
 * printed. bench/wedge.sh counts the three outcomes over many runs.
 */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_long beats;
static char buf[1 << 20];

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *watchdog(void *arg)
{
    (void)arg;
    long last = -1;
    for (int still = 0; still < 30; usleep(100000)) {
        long b = atomic_load(&beats);
        still = b == last ? still + 1 : 0;
        last = b;
    }
    printf("wedged\n");
    fflush(stdout);
    _exit(3);
}

static void *killer(void *arg)
{
    usleep((useconds_t)(size_t)arg);
    kill(getpid(), SIGKILL);
    return NULL;
}

static void victim(bool sends, int len)
{
    pthread_t t;
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    pthread_create(&t, NULL, killer, (void *)(size_t)(50000 + rand() % 100000));
    for (MPI_Request rq[64];;) {
        for (int i = 0; i < 64; i++) {
            if (sends)
                MPI_Isend(buf, len, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &rq[i]);
            else
                MPI_Irecv(buf, (int)sizeof(buf), MPI_BYTE, 0, 1, MPI_COMM_WORLD, &rq[i]);
        }
        MPI_Waitall(64, rq, MPI_STATUSES_IGNORE);
    }
}

static void survivor_recv(void)
{
    double last = now();
    while (now() - last < 1.0) {
        int flag = 0, done = 0;
        MPI_Message m;
        MPI_Request r;
        atomic_fetch_add(&beats, 1);
        if (MPI_Improbe(1, 1, MPI_COMM_WORLD, &flag, &m, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return;
        if (!flag)
            continue;
        MPI_Imrecv(buf, (int)sizeof(buf), MPI_BYTE, &m, &r);
        for (double t0 = now(); !done && now() - t0 < 1.0; atomic_fetch_add(&beats, 1))
            if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                return;
        last = now();
    }
}

static void survivor_send(int len)
{
    MPI_Request rq[8];
    int n = 0;
    for (double t0 = now(); now() - t0 < 1.5;) {
        atomic_fetch_add(&beats, 1);
        if (n < 8 && MPI_Isend(buf, len, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &rq[n]) == MPI_SUCCESS)
            n++;
        for (int i = 0; i < n; i++) {
            int done = 0;
            if (MPI_Test(&rq[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done)
                rq[i--] = rq[--n]; /* completed, or failed: MPI freed it */
        }
    }
}

int main(int argc, char **argv)
{
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    bool recv = argc < 2 || strcmp(argv[1], "send") != 0;
    int len = argc > 2 ? atoi(argv[2]) : (recv ? 1024 : 16384);
    if (size != 2 || len < 1 || len > (int)sizeof(buf)) {
        fprintf(stderr, "usage: mpirun -n 2 bench_wedge recv|send [BYTES <= %zu]\n", sizeof(buf));
        return 2;
    }
    if (rank == 1)
        victim(recv, len);
    pthread_t t;
    pthread_create(&t, NULL, watchdog, NULL);
    if (recv)
        survivor_recv();
    else
        survivor_send(len);
    printf("survived\n");
    fflush(stdout);
    _exit(0); /* MPI_Finalize would wait for the dead peer */
}
