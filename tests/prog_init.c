/*
 * tests/prog_init.c - a worker for integration tests of rk_init/rk_finalize under mpirun:
 * prints "rank R world W" and, with RK_EVENT_LOG set, writes N test events per rank from
 * two threads at once.
 *   prog_init rewrite MIB   writes MIB of memory, rk_init, writes it again and prints
 *                           "rewrite faults N of P pages children C" (the minor faults of
 *                           the second write: P after a fork inside MPI_Init, about 0
 *                           without; C the processes whose parent this one is, then)
 *   prog_init connect-nobody
 *                           after rk_init, MPI_Comm_connect to a port of its own that
 *                           nothing accepts on (Open MPI waits inside for the other side's
 *                           PMIx exchange, as a spawn's root does for a dead newcomer's);
 *                           prints "connect to nobody: failed|returned after S s"
 *   prog_init die-at-start  calls MPI_Init_thread itself; the last rank SIGKILLs itself
 *                           right after it, the others call rk_init and print
 *                           "rk_init: ok|failed after S s: <error>" (a start-up that
 *                           loses a peer must end, not wait for it forever)
 */
#include <dirent.h>
#include <mpi.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "prog_common.h"
#include "common.h"
#include "rekindle.h"

/* How many processes have this one as their parent (from /proc/PID/stat). */
static int children(void)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[300], buf[512];
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        FILE *f = e->d_name[0] >= '1' && e->d_name[0] <= '9' ? fopen(path, "r") : NULL;
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
        int ppid = -1;
        if (p && sscanf(p + 1, " %*c %d", &ppid) == 1 && ppid == (int)getpid())
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    size_t len = argc > 2 && strcmp(argv[1], "rewrite") == 0 ? (size_t)atol(argv[2]) << 20 : 0;
    char *mem = len ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    if (mem == MAP_FAILED)
        return 2;
    if (mem)
        memset(mem, 1, len);
    if (argc > 1 && strcmp(argv[1], "die-at-start") == 0) {
        int provided, r, n;
        struct timespec t0, t1;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        MPI_Comm_size(MPI_COMM_WORLD, &n);
        if (r == n - 1)
            raise(SIGKILL);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rk_ctx *c = NULL;
        int irc = rk_init(&c, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("rk_init: %s after %.1f s: %s\n", irc == 0 ? "ok" : "failed",
               (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
               irc == 0 ? "" : rk_last_error());
        fflush(stdout);
        if (irc == 0)
            rk_finalize(&c);
        _exit(irc == 0 ? 0 : 6); /* no MPI_Finalize: a peer is gone */
    }
    rk_ctx *ctx = prog_rk_init();
    if (!ctx)
        return 3;
    int rc;
    if (mem) {
        struct rusage a, b;
        getrusage(RUSAGE_SELF, &a);
        memset(mem, 2, len);
        getrusage(RUSAGE_SELF, &b);
        printf("rewrite faults %ld of %zu pages children %d\n", b.ru_minflt - a.ru_minflt, len / 4096, children());
    }
    printf("rank %d world %d\n", rk_rank(ctx), rk_world(ctx));
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "connect-nobody") == 0) {
        char port[MPI_MAX_PORT_NAME];
        MPI_Comm inter = MPI_COMM_NULL;
        struct timespec t0, t1;
        MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        if (MPI_Open_port(MPI_INFO_NULL, port) != MPI_SUCCESS)
            return 5;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("connect to nobody: %s after %.1f s\n", rc == MPI_SUCCESS ? "returned" : "failed",
               (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
        fflush(stdout);
    }
    rc = rk_finalize(&ctx);
    if (rc != 0 || ctx != NULL) {
        fprintf(stderr, "rk_finalize: %s\n", rk_strerror(rc));
        return 4;
    }
    (void)argc, (void)argv;
    return 0;
}
