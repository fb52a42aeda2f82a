/*
 * tests/prog_run.c - a worker for the tests of `rekindle run` (tests/test_run.c).
 *
 *   prog_run MODE DIR
 *
 * Every mode first appends "start <rank> <RK_RUN_ATTEMPT>" to DIR/launches (one line per
 * process and launch, O_APPEND), rank from OMPI_COMM_WORLD_RANK. Then:
 *   env       writes every RK_* variable it sees (and OMPI_MCA_pml, OMPI_MCA_mtl) to
 *             DIR/env-<rank>; exits 0
 *   kill1     MPI job: rank 1 SIGKILLs itself after MPI_Init; the others wait a little,
 *             write DIR/done-<rank>, MPI_Finalize and exit 0
 *   fail      exits 3
 *   hang      writes its pid to DIR/pid-<rank>, ignores SIGINT and SIGTERM and sleeps
 *             forever (only SIGKILL ends it)
 *   slow0     rank 0 works 8 s (past the launcher's grace after another's completion)
 *             before it writes DIR/done-0 and exits 0; the others exit 0 at once
 *   spares    the last RK_SPARES ranks (spares never brought in) exit 0, the others 3
 *   silent1   rank 1 goes silent as on a lost host: it writes "<pid> <wrapper's pid>" to
 *             DIR/pid-1, stops its wrapper and itself (SIGSTOP: no record, no beat, and
 *             mpirun never sees it end) and, continued (mpirun's SIGCONT before its
 *             SIGTERM), still never ends (SIGINT and SIGTERM ignored: a lost host does not
 *             come back to record anything); the others exit 3 after 300 ms
 *   stale1    silent1, but first the mtime of rank 1's beat file is set an hour ahead (a
 *             host whose clock runs ahead): its content no longer changes
 *   pastbeat0 rank 0 stops its wrapper and for 8 s rewrites the wrapper's beat file itself
 *             with a new counter every 200 ms, each time setting its mtime back to 2000
 *             (a host whose clock runs behind), then continues the wrapper, writes
 *             DIR/done-0 and exits 0; the others exit 3 at once
 *   fail1     rank 1 exits 3 at once; the others exit 0 after 2 s
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int put(const char *dir, const char *name, const char *rank, const char *text, int flags)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s%s", dir, name, rank);
    int fd = open(path, O_WRONLY | O_CREAT | flags, 0644);
    if (fd < 0) {
        perror(path);
        return -1;
    }
    ssize_t w = write(fd, text, strlen(text)); /* one write: O_APPEND lines never mix */
    close(fd);
    return w == (ssize_t)strlen(text) ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: prog_run env|kill1|fail|hang|slow0|spares|silent1|stale1|pastbeat0|fail1 DIR\n");
        return 2;
    }
    const char *mode = argv[1], *dir = argv[2];
    const char *rank = getenv("OMPI_COMM_WORLD_RANK"), *attempt = getenv("RK_RUN_ATTEMPT");
    if (!rank)
        rank = "?";
    char line[256];
    snprintf(line, sizeof(line), "start %s %s\n", rank, attempt ? attempt : "?");
    if (put(dir, "launches", "", line, O_APPEND) != 0)
        return 2;

    if (strcmp(mode, "env") == 0) {
        char buf[16384];
        size_t n = 0;
        buf[0] = '\0';
        for (char **e = environ; *e; e++)
            if ((strncmp(*e, "RK_", 3) == 0 || strncmp(*e, "OMPI_MCA_pml=", 13) == 0 ||
                 strncmp(*e, "OMPI_MCA_mtl=", 13) == 0) && n < sizeof(buf))
                n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s\n", *e);
        return put(dir, "env-", rank, buf, O_TRUNC) == 0 ? 0 : 2;
    }
    if (strcmp(mode, "kill1") == 0) {
        MPI_Init(&argc, &argv);
        int r = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        if (r == 1)
            raise(SIGKILL);
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
        put(dir, "done-", rank, "done\n", O_TRUNC);
        MPI_Finalize();
        return 0;
    }
    if (strcmp(mode, "fail") == 0)
        return 3;
    if (strcmp(mode, "slow0") == 0) {
        if (strcmp(rank, "0") == 0) {
            struct timespec ts = {8, 0};
            nanosleep(&ts, NULL);
            return put(dir, "done-", rank, "done\n", O_TRUNC) == 0 ? 0 : 2;
        }
        return 0;
    }
    if (strcmp(mode, "spares") == 0) {
        const char *size = getenv("OMPI_COMM_WORLD_SIZE"), *spares = getenv("RK_SPARES");
        return atoi(rank) >= atoi(size ? size : "0") - atoi(spares ? spares : "0") ? 0 : 3;
    }
    const char *records = getenv("RK_RUN_RECORDS");
    char beat[4096];
    snprintf(beat, sizeof(beat), "%s/alive-%s", records ? records : ".", rank);
    if (strcmp(mode, "silent1") == 0 || strcmp(mode, "stale1") == 0) {
        if (strcmp(rank, "1") == 0) {
            snprintf(line, sizeof(line), "%ld %ld\n", (long)getpid(), (long)getppid());
            if (put(dir, "pid-", rank, line, O_TRUNC) != 0)
                return 2;
            signal(SIGINT, SIG_IGN);
            signal(SIGTERM, SIG_IGN);
            kill(getppid(), SIGSTOP);
            struct timespec ahead[2] = {{time(NULL) + 3600, 0}, {time(NULL) + 3600, 0}};
            if (strcmp(mode, "stale1") == 0 && utimensat(AT_FDCWD, beat, ahead, 0) != 0)
                perror(beat);
            raise(SIGSTOP);
            for (;;)
                pause();
        }
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
        return 3;
    }
    if (strcmp(mode, "pastbeat0") == 0) {
        if (strcmp(rank, "0") != 0)
            return 3;
        pid_t wrapper = getppid();
        /* Its wrapper may not have made its beat file yet: stopped before that, no beat of
           this rank would ever be seen (the launch then ended as for a silent worker). */
        struct timespec poll = {0, 10 * 1000 * 1000};
        for (int i = 0; i < 1000 && access(beat, F_OK) != 0; i++)
            nanosleep(&poll, NULL);
        kill(wrapper, SIGSTOP);
        struct timespec past[2] = {{946684800, 0}, {946684800, 0}}, tick = {0, 200 * 1000 * 1000};
        for (int i = 0; i < 40; i++) {
            int fd = open(beat, O_WRONLY);
            if (fd >= 0) {
                int len = snprintf(line, sizeof(line), "host stand-in\nbeat %d\n", 1000000 + i);
                if (pwrite(fd, line, (size_t)len, 0) != len)
                    perror(beat);
                close(fd);
            }
            if (utimensat(AT_FDCWD, beat, past, 0) != 0)
                perror(beat);
            nanosleep(&tick, NULL);
        }
        kill(wrapper, SIGCONT);
        return put(dir, "done-", rank, "done\n", O_TRUNC) == 0 ? 0 : 2;
    }
    if (strcmp(mode, "fail1") == 0) {
        if (strcmp(rank, "1") == 0)
            return 3;
        struct timespec ts = {2, 0};
        nanosleep(&ts, NULL);
        return 0;
    }
    if (strcmp(mode, "hang") == 0) {
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        snprintf(line, sizeof(line), "%ld\n", (long)getpid());
        if (put(dir, "pid-", rank, line, O_TRUNC) != 0)
            return 2;
        for (;;)
            pause();
    }
    fprintf(stderr, "prog_run: unknown mode '%s'\n", mode);
    return 2;
}
