/*
 * tools/run_procs.c - the processes of a session or a process group, as /proc lists them:
 * what `rekindle run` ends when mpirun is gone (its session) and when a discovery script
 * passes its bound (its group).
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run.h"

int run_procs_signal(pid_t id, bool by_session, int sig)
{
    int found = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == getpid())
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        /* pid (comm) state ppid pgrp session ... ; comm may hold spaces: after the last ')' */
        char *p = strrchr(buf, ')');
        char state = 0;
        long ppid, pgrp, session;
        if (!p || sscanf(p + 1, " %c %ld %ld %ld", &state, &ppid, &pgrp, &session) != 4)
            continue;
        if ((by_session ? session : pgrp) != id || state == 'Z')
            continue;
        found++;
        if (sig)
            kill((pid_t)pid, sig);
    }
    closedir(d);
    return found;
}
