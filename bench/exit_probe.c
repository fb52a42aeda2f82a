/*
 * bench/exit_probe.c - where the time between a SIGKILL and its parent's waitpid goes.
 *
 *   exit_probe [--runs N] [--settle MS] -- COMMAND [ARGS...]
 *
 * Starts COMMAND N times (default 10) as its child, with the write end of a pipe as its
 * file descriptor 3; COMMAND writes one byte there when it is ready (a CUDA context made,
 * memory allocated) and keeps the descriptor open. SETTLE ms later (default 200) the probe
 * takes the time and sends SIGKILL, then spins (no sleep) until waitpid returns the child,
 * noting the first time each of these was seen, in ms from the kill:
 *   leader     the main thread's PF_EXITING flag (/proc/PID/stat): its exit began
 *   ending     det_proc_ending: every thread inside its exit (what `rekindle run`'s
 *              wrapper reports on: detector/det_parent.c, P5)
 *   eof        the pipe's end of file: the kernel closed the child's descriptors
 *   zombie     the main thread's state Z
 *   waitpid    waitpid(WNOHANG) returned the child: what the wrapper waited for before
 * Then the median and largest of each over the runs, and the child's threads at the kill.
 * Exit status 0, 1 when a run failed (the child did not get ready within 120 s).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../detector/det.h"

enum { EV_LEADER, EV_ENDING, EV_EOF, EV_ZOMBIE, EV_WAITPID, NEV };
static const char *ev_name[NEV] = {"leader", "ending", "eof", "zombie", "waitpid"};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The main thread's state and flags from /proc/PID/stat; 0 on success. */
static int leader_stat(pid_t pid, char *state, unsigned long *flags, long *threads)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    return det_proc_stat(path, -1, state, flags, threads);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int runs = 10, settle = 200, a = 1;
    for (; a < argc && strcmp(argv[a], "--") != 0; a++) {
        if (strcmp(argv[a], "--runs") == 0 && a + 1 < argc)
            runs = atoi(argv[++a]);
        else if (strcmp(argv[a], "--settle") == 0 && a + 1 < argc)
            settle = atoi(argv[++a]);
        else {
            fprintf(stderr, "usage: exit_probe [--runs N] [--settle MS] -- COMMAND [ARGS...]\n");
            return 2;
        }
    }
    if (a + 1 >= argc || runs < 1 || runs > 1000 || settle < 0) {
        fprintf(stderr, "usage: exit_probe [--runs N] [--settle MS] -- COMMAND [ARGS...]\n");
        return 2;
    }
    char **cmd = argv + a + 1;
    double (*t)[NEV] = calloc((size_t)runs, sizeof(*t));
    long threads = 0;
    if (!t)
        return 1;
    for (int r = 0; r < runs; r++) {
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0)
            return perror("pipe2"), 1;
        pid_t pid = fork();
        if (pid < 0)
            return perror("fork"), 1;
        if (pid == 0) {
            if (dup2(pfd[1], 3) < 0) /* dup2 clears close-on-exec */
                _exit(127);
            execvp(cmd[0], cmd);
            fprintf(stderr, "exit_probe: cannot run %s: %s\n", cmd[0], strerror(errno));
            _exit(127);
        }
        close(pfd[1]);
        struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
        char c;
        if (poll(&pf, 1, 120000) != 1 || read(pfd[0], &c, 1) != 1) {
            fprintf(stderr, "exit_probe: run %d: %s was not ready within 120 s\n", r, cmd[0]);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return 1;
        }
        usleep((useconds_t)settle * 1000);
        char st;
        unsigned long fl;
        leader_stat(pid, &st, &fl, &threads);
        fcntl(pfd[0], F_SETFL, O_NONBLOCK);
        double t0 = now_ms();
        kill(pid, SIGKILL);
        for (int e = 0; e < NEV; e++)
            t[r][e] = -1;
        for (bool done = false; !done;) {
            double now = now_ms() - t0;
            if (t[r][EV_LEADER] < 0 || t[r][EV_ZOMBIE] < 0) {
                if (leader_stat(pid, &st, &fl, NULL) == 0) {
                    if (t[r][EV_LEADER] < 0 && (fl & 0x4ul))
                        t[r][EV_LEADER] = now;
                    if (t[r][EV_ZOMBIE] < 0 && st == 'Z')
                        t[r][EV_ZOMBIE] = now;
                }
            }
            if (t[r][EV_ENDING] < 0 && det_proc_ending(pid, -1) == 1)
                t[r][EV_ENDING] = now;
            if (t[r][EV_EOF] < 0 && read(pfd[0], &c, 1) == 0)
                t[r][EV_EOF] = now;
            if (waitpid(pid, NULL, WNOHANG) == pid) {
                t[r][EV_WAITPID] = now_ms() - t0;
                done = true;
            }
        }
        close(pfd[0]);
        printf("run %d:", r);
        for (int e = 0; e < NEV; e++)
            printf(" %s %.2f", ev_name[e], t[r][e]);
        printf(" ms\n");
    }
    printf("exit_probe: %s, %d runs, %ld threads at the kill: median (max) ms from SIGKILL:", cmd[0], runs,
           threads);
    double *col = calloc((size_t)runs, sizeof(double));
    for (int e = 0; e < NEV && col; e++) {
        int n = 0;
        for (int r = 0; r < runs; r++)
            if (t[r][e] >= 0)
                col[n++] = t[r][e];
        if (n == 0) {
            printf(" %s never", ev_name[e]);
            continue;
        }
        qsort(col, (size_t)n, sizeof(double), cmp_double);
        printf(" %s %.2f (%.2f)%s", ev_name[e], n % 2 ? col[n / 2] : (col[n / 2 - 1] + col[n / 2]) / 2, col[n - 1],
               n < runs ? " [not every run]" : "");
    }
    printf("\n");
    free(col);
    free(t);
    return 0;
}
