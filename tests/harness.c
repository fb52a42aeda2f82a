/* tests/harness.c - see harness.h. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

int th_main(Suite *s)
{
    SRunner *sr = srunner_create(s);
    const char *fork_env = getenv("CK_FORK");
    if (!fork_env || strcmp(fork_env, "no") != 0)
        srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

void th_skip_suite(const char *why)
{
    printf("SKIP: %s\n", why);
    fflush(stdout);
    exit(77);
}

bool th_exists(const char *dir, const char *name)
{
    char p[8200];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

int th_dot_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] == '.' && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

char *th_bin(const char *name)
{
    const char *b = getenv("RK_TEST_BUILD");
    char *p = NULL;
    if (asprintf(&p, "%s/bin/%s", b ? b : "build", name) < 0)
        return NULL;
    return p;
}

char *th_tmpdir(const char *tag)
{
    const char *base = getenv("RK_TEST_TMP");
    char *p = NULL;
    if (asprintf(&p, "%s/%s.XXXXXX", base ? base : "/tmp", tag) < 0)
        return NULL;
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int th_rmrf(const char *path)
{
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -errno;
}

char *th_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf)
        return NULL;
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

int th_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -errno;
    size_t w = fwrite(data, 1, len, f);
    int rc = fclose(f);
    return w == len && rc == 0 ? 0 : -EIO;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int th_time_scale(void)
{
    const char *s = getenv("RK_TEST_TIME_SCALE");
    int k = s ? atoi(s) : 1;
    return k >= 1 && k <= 99 ? k : 1;
}

int th_run(char *const argv[], const char *const envp_extra[], int timeout_s, char **out)
{
    int scale = th_time_scale();
    timeout_s *= scale;
    int pipefd[2];
    if (out)
        *out = NULL;
    if (pipe2(pipefd, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(pipefd[0]);
        close(pipefd[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        dup2(pipefd[1], STDOUT_FILENO);
        dup2(pipefd[1], STDERR_FILENO);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, STDIN_FILENO);
        if (scale > 1 && !getenv("RK_HEARTBEAT_MS")) {
            char hb[32];
            snprintf(hb, sizeof(hb), "%d", 100 * scale);
            setenv("RK_HEARTBEAT_MS", hb, 1);
        }
        for (size_t i = 0; envp_extra && envp_extra[i]; i++)
            putenv((char *)envp_extra[i]);
        execvp(argv[0], argv);
        fprintf(stderr, "th_run: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    close(pipefd[1]);
    size_t cap = 8192, n = 0;
    char *buf = malloc(cap);
    int64_t deadline = now_ms() + (int64_t)timeout_s * 1000;
    bool timed_out = false, eof = false;
    while (!eof) {
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pfd = {.fd = pipefd[0], .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
        if (pr < 0 && errno != EINTR)
            break;
        if (pr <= 0)
            continue;
        if (buf && cap - n < 4096) {
            char *nb = realloc(buf, cap * 2);
            if (nb) {
                buf = nb;
                cap *= 2;
            }
        }
        char sink[4096];
        char *dst = buf && cap - n > 1 ? buf + n : sink;
        size_t room = buf && cap - n > 1 ? cap - n - 1 : sizeof(sink);
        ssize_t r = read(pipefd[0], dst, room);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            eof = true;
        else if (dst != sink)
            n += (size_t)r;
    }
    close(pipefd[0]);
    int status = 0;
    if (timed_out) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
    }
    /* The group leader may have exited while children hold the pipe; wait for it with the
       same bound, then make sure nothing of the group survives. */
    for (;;) {
        pid_t w = waitpid(pid, &status, timed_out ? 0 : WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR)
            break;
        if (now_ms() > deadline) {
            timed_out = true;
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
        } else {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    kill(-pid, SIGKILL); /* stragglers of the group, if any */
    if (buf)
        buf[n] = '\0';
    if (out)
        *out = buf;
    else
        free(buf);
    if (timed_out)
        return -1;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

int th_sh(const char *cmd, int timeout_s, char **out)
{
    char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
    return th_run(argv, NULL, timeout_s, out);
}

int th_mpirun(int n, char *const argv[], const char *const envp_extra[], int timeout_s, char **out)
{
    char nbuf[16];
    snprintf(nbuf, sizeof(nbuf), "%d", n);
    const char *pre[] = {"mpirun", "-n", nbuf, "--oversubscribe", "--allow-run-as-root",
                         "--mca", "btl", "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none"};
    size_t npre = sizeof(pre) / sizeof(pre[0]), na = 0;
    while (argv[na])
        na++;
    char **full = calloc(npre + na + 1, sizeof(char *));
    if (!full)
        return -1;
    for (size_t i = 0; i < npre; i++)
        full[i] = (char *)pre[i];
    for (size_t i = 0; i < na; i++)
        full[npre + i] = argv[i];
    int rc = th_run(full, envp_extra, timeout_s, out);
    free(full);
    return rc;
}

bool th_have_gpu(char *why, size_t cap)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, cap, "no GPU: the CUDA driver (libcuda.so.1) is not installed");
        return false;
    }
    int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*cu_count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int count = 0;
    bool ok = cu_init && cu_count && cu_init(0) == 0 && cu_count(&count) == 0 && count > 0;
    if (!ok)
        snprintf(why, cap, "no GPU: the CUDA driver reports no usable device");
    dlclose(h);
    return ok;
}

int th_chaos_summary(const char *out, int *r, int *f, int *v)
{
    const char *p = out, *last = NULL;
    while (p && (p = strstr(p, "chaos: ")) != NULL) {
        if (sscanf(p, "chaos: %d runs, %d faults injected, %d violations", r, f, v) == 3)
            last = p;
        p += 7;
    }
    return last ? 0 : -1;
}

int th_mpirun_prog(int n, bool recovery, const char *prog, char *const args[], const char *const envp_extra[],
                   int timeout_s, char **out)
{
    char *argv[16];
    int a = 0;
    if (recovery) {
        argv[a++] = "--enable-recovery";
        argv[a++] = "--mca";
        argv[a++] = "orte_abort_on_non_zero_status";
        argv[a++] = "0";
    }
    argv[a++] = (char *)prog;
    for (int i = 0; args[i] && a < 15; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    return th_mpirun(n, argv, envp_extra, timeout_s, out);
}
