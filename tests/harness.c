/* tests/harness.c - see harness.h. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
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

static char *build_path(const char *dir, const char *name)
{
    const char *b = getenv("RK_TEST_BUILD");
    char *p = NULL;
    if (asprintf(&p, "%s/%s/%s", b ? b : "build", dir, name) < 0)
        return NULL;
    return p;
}

char *th_bin(const char *name)
{
    return build_path("bin", name);
}

char *th_prog(const char *name)
{
    return build_path("tests", name);
}

char *th_tmpdir(const char *tag)
{
    const char *base = getenv("RK_TEST_TMP");
    char *p = NULL;
    if (asprintf(&p, "%s/%s.XXXXXX", base ? base : "/tmp", tag) < 0)
        ck_abort_msg("th_tmpdir %s: out of memory", tag);
    if (!mkdtemp(p)) /* (its caller would build paths on NULL: files in "(null)/" of the cwd) */
        ck_abort_msg("th_tmpdir: cannot make %s: %s", p, strerror(errno));
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

void th_capture_begin(th_capture *c)
{
    char *dir = th_tmpdir("cap");
    snprintf(c->path, sizeof c->path, "%s/stderr", dir);
    free(dir);
    fflush(stderr);
    c->saved = dup(2);
    int fd = open(c->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
}

char *th_capture_end(th_capture *c)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    char *s = th_read_file(c->path, NULL);
    ck_assert_ptr_nonnull(s);
    return s;
}

void th_pattern(unsigned char *p, size_t n, unsigned k)
{
    uint64_t x = 0x9E3779B97F4A7C15ULL * (k + 1);
    for (size_t j = 0; j < n; j++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[j] = (unsigned char)x;
    }
}

void th_flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
    unsigned char b = 0;
    ck_assert_int_eq(pread(fd, &b, 1, off), 1);
    b ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);
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

/* The probe itself, in the child th_have_gpu forks: 0 a device, 1 no driver, 2 none usable. */
static int gpu_probe(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return 1;
    int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*cu_count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int count = 0;
    return cu_init && cu_count && cu_init(0) == 0 && cu_count(&count) == 0 && count > 0 ? 0 : 2;
}

/* Probed in a child process: a process that has initialized CUDA cannot use it in the
   children it forks ("initialization error"), and Check runs every test in a child of the
   suite's process (seen on a GPU: test_ring_nccl's cases in the suite's own process). */
bool th_have_gpu(char *why, size_t cap)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(gpu_probe());
    int st = 0;
    int code = pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) ? 3 : WEXITSTATUS(st);
    if (code == 1)
        snprintf(why, cap, "no GPU: the CUDA driver (libcuda.so.1) is not installed");
    else if (code == 2)
        snprintf(why, cap, "no GPU: the CUDA driver reports no usable device");
    else if (code != 0)
        snprintf(why, cap, "no GPU: the probe of the CUDA driver did not finish (status %#x)", st);
    return code == 0;
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

const char *th_tail(const char *out, size_t n)
{
    size_t len = out ? strlen(out) : 0;
    return out ? out + (len > n ? len - n : 0) : "";
}

int th_count(const char *out, const char *needle)
{
    int n = 0;
    for (const char *p = out; p && (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* ---- rk-train's final lines (docs/RK-TRAIN.md) ----------------------------------------- */

/* Every rank's final line: `world` lines, all the same, for `steps` steps; the hash. */
void th_final_lines(const char *out, int world, int steps, char hash[17])
{
    char want[64];
    snprintf(want, sizeof(want), "final step=%d world=%d hash=", steps, world);
    int n = 0;
    hash[0] = '\0';
    for (const char *p = out; (p = strstr(p, "final step=")); p++) {
        ck_assert_msg(strncmp(p, want, strlen(want)) == 0, "final line %.60s, want %s...", p, want);
        const char *h = p + strlen(want);
        ck_assert_msg(strspn(h, "0123456789abcdef") == 16 && h[16] == '\n', "bad hash in %.60s", p);
        if (n++ == 0)
            snprintf(hash, 17, "%.16s", h);
        else
            ck_assert_msg(strncmp(h, hash, 16) == 0, "ranks disagree: %.16s vs %s", h, hash);
    }
    ck_assert_msg(n == world, "%d final lines, want %d:\n%s", n, world, out);
}

/* A job script's output: the job's final lines, then "replay" and the replay's; both give
   `world` lines of `steps` steps and the same hash. Frees out. */
void th_job_equals_replay(char *out, int world, int steps)
{
    char h_job[17], h_replay[17];
    const char *replay = strstr(out, "replay\n");
    ck_assert_ptr_nonnull(replay);
    char *job = strndup(out, (size_t)(replay - out));
    th_final_lines(strstr(job, "final"), world, steps, h_job);
    th_final_lines(replay, world, steps, h_replay);
    ck_assert_str_eq(h_job, h_replay);
    free(job);
    free(out);
}

int th_train_kill_replay(const char *dir, int world, int steps, const char *args, const char *env, int kill_call,
                         int timeout_s, char **out)
{
    char *bin = th_bin("rk-train"), *rekindle = th_bin("rekindle"), *cmd = NULL;
    const char *src = getenv("RK_TEST_SRC");
    int n = asprintf(
        &cmd,
        "W=%s; B=%s; R=%s; N=%d; A='%s'\n"
        "export RK_CKPT_DIR=$W/c RK_KEEP=100 RK_EVENT_LOG=$W/ev %s\n"
        "RK_FAULT=allreduce@%d=crash CHAOS_FAULT_RANK=1 $R run -n $N -- %s/chaos/worker.sh $B --steps %d $A "
        "> $W/out 2>&1\n"
        "echo \"exit=$?\"; grep '^final' $W/out\n"
        "echo \"unpartnered=$(grep -c 'no partner copy of the snapshot' $W/out)\"\n"
        "grep -h '\"resumed\"' $W/ev.*\n"
        "s=$(grep -h '\"resumed\"' $W/ev.* | head -1 | sed 's/.*\"step\": \\([0-9]*\\).*/\\1/')\n"
        "d=step-$(printf %%012d \"$s\"); mkdir -p $W/r\n"
        /* A memory rollback resumes the newest snapshot (one at every step), which is a
           checkpoint on disk only when its step is one of RK_CKPT_EVERY's (and its write
           was committed before the kill): otherwise the replay's checkpoint of that step
           comes from a fault-free run of the first $s steps on the N workers. */
        "if [ -d $W/c/$d ]; then cp -r $W/c/$d $W/r/ || exit 1; else\n"
        "  RK_CKPT_DIR=$W/r RK_CKPT_EVERY=$s RK_EVENT_LOG= $R run -n $N -- $B --steps $s $A > /dev/null || exit 1\n"
        "  [ -d $W/r/$d ] || exit 1; fi\n"
        "echo replay; RK_CKPT_DIR=$W/r RK_EVENT_LOG= $R run -n $((N - 1)) -- $B --steps %d $A | grep '^final'\n",
        dir, bin, rekindle, world, args, env, kill_call, src ? src : ".", steps, steps);
    int rc = n < 0 ? -1 : th_sh(cmd, timeout_s, out);
    free(cmd);
    free(bin);
    free(rekindle);
    return rc;
}

void th_train_spare(const char *dir, int steps, const char *args, bool kill_one, int timeout_s, char **out)
{
    char *rekindle = th_bin("rekindle"), *bin = th_bin("rk-train"), *cmd = NULL;
    const char *src = getenv("RK_TEST_SRC");
    /* The victim dies by its own fault point (chaos/worker.sh keeps RK_FAULT on rank 1
       alone): a kill from outside raced the job's pace (a job that ended first had no
       spare join). */
    int n = asprintf(&cmd,
                     "export RK_CKPT_DIR=%s/ck RK_CKPT_EVERY=50 RK_EVENT_LOG=%s/ev; "
                     "if [ %d = 1 ]; then export RK_FAULT=allreduce@%d=crash CHAOS_FAULT_RANK=1; fi; "
                     "%s run -n 3 --spares 1 -- %s/chaos/worker.sh %s --steps %d %s > %s/out 2>&1; "
                     "echo \"exit=$?\"; cat %s/out; cat %s/ev.* 2>/dev/null | grep spare_joined; true",
                     dir, dir, kill_one, TH_SPARE_KILL_AT, rekindle, src ? src : ".", bin, steps, args, dir, dir, dir);
    ck_assert(n > 0);
    int rc = th_sh(cmd, timeout_s, out);
    ck_assert_msg(rc == 0, "job script exit %d:\n%.3000s", rc, *out ? *out : "");
    free(cmd);
    free(rekindle);
    free(bin);
}

int th_train_elastic(const char *dir, int steps, const char *args, enum th_elastic how, int in_place, char **out)
{
    char *bin = th_bin("rk-train"), *rekindle = th_bin("rekindle"), *cmd = NULL;
    const char *src = getenv("RK_TEST_SRC");
    int n = asprintf(
        &cmd,
        "W=%s; B=%s; R=%s; N=%d; A='%s'; HOW=%d; S=%s; H=$(hostname); IP=%d; M=3; [ $HOW = 3 ] && M=4\n"
        "export RK_HOSTS_PREFIX=rke RK_HOSTS_NET=10.82.0\n"
        "case $HOW in 0|3) echo \"$H:2\" > $W/hosts;; 1) echo \"$H:3\" > $W/hosts;;\n"
        "  2) $S/scripts/hosts up 3 $W/hostfile 1 > $W/hosts.log 2>&1 || { cat $W/hosts.log; exit 1; }\n"
        "     printf 'rke1:1\\nrke2:1\\nrke3:1\\n' > $W/hosts;; esac\n"
        "(\n"
        "[ $HOW = 2 ] && eval \"$($S/scripts/hosts env)\"\n"
        "export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=50 RK_KEEP=1000 RK_EVENT_LOG=$W/ev RK_RUN_DIR=$W/run "
        "RK_TIMEOUT_MS=8000\n"
        "G='--grow relaunch'; [ $IP != 0 ] && G='--grow inplace'\n"
        /* A host lost whole is known to the launcher only after 3 beats of its wrapper's
           silence and the cool-down: the two left could end the job first (seen once in
           CI, fast steps). They are held at their 1000th rk_step_done until it decided. */
        "[ $HOW = 2 ] && { touch $W/hold; export RK_FAULT=step_done@1000=hang RK_FAULT_HOLD=$W/hold; }\n"
        "$R run --host-discovery-script \"cat $W/hosts\" --discovery-interval 0.2 --blacklist-cooldown 0.5 --max-np $M "
        "$G -- $B --steps $N $A > $W/out 2> $W/err & job=$!\n"
        "for i in $(seq 1200); do [ -d $W/c/step-000000000100 ] && break; sleep 0.05; done\n"
        "case $HOW in 0|3) echo \"$H:$M\" > $W/hosts; touch $W/run/grow;;\n"
        "  1) for p in $(pgrep -x rk-train); do\n"
        "       tr '\\0' '\\n' < /proc/$p/environ | grep -qx RK_EVENT_LOG=$W/ev && "
        "       tr '\\0' '\\n' < /proc/$p/environ | grep -qx OMPI_COMM_WORLD_RANK=1 && kill -9 $p; done;;\n"
        "  2) kill -9 $(ip netns pids rke2) 2>/dev/null\n"
        "     for i in $(seq 1200); do grep -qs 'rekindle: run: .*growing' $W/err && break; sleep 0.05; done\n"
        "     rm -f $W/hold;; esac\n"
        "wait $job; echo \"exit=$?\"\n"
        ")\n"
        "[ $HOW = 2 ] && $S/scripts/hosts down > /dev/null 2>&1\n"
        "grep '^final' $W/out; grep 'rekindle: run' $W/err\n"
        /* the members' joins, by how many newcomers each started */
        "for k in 1 2; do echo \"joins of $k: $(grep -hs '\"join_started\"' $W/ev.* | grep -c \"\\\"n\\\": $k\")\"; done\n"
        "st() { grep -h '\"resumed\"' $W/ev.* | grep \"\\\"$1\\\"\" | sed 's/.*\"step\": \\([0-9]*\\).*/\\1/' | sort -n; }\n"
        /* grown in place, the growth's resume is from memory as well: the last one */
        "a=$(st memory | head -n 1); b=$(st disk | tail -n 1); [ $IP = 1 ] && b=$(st memory | tail -n 1)\n"
        "echo \"memory=$a disk=$b\"\n"
        "[ -n \"$b\" ] || exit 1; mkdir -p $W/r; export RK_CKPT_DIR=$W/r RK_EVENT_LOG=\n"
        /* The replay, on this host: the world of the job at each step, from the recorded steps. */
        "if [ $HOW = 1 ] || [ $HOW = 2 ]; then [ -n \"$a\" ] || exit 1\n"
        "  RK_CKPT_EVERY=$a $R run -n 3 -- $B --steps $a $A > /dev/null 2>&1 || exit 1\n"
        "  RK_CKPT_EVERY=$b $R run -n 2 -- $B --steps $b $A > /dev/null 2>&1 || exit 1\n"
        "else RK_CKPT_EVERY=$b $R run -n 2 -- $B --steps $b $A > /dev/null 2>&1 || exit 1; fi\n"
        "echo replay; $R run -n $M -- $B --steps $N $A 2>/dev/null | grep '^final'\n",
        dir, bin, rekindle, steps, args, (int)how, src ? src : ".", in_place);
    int rc = n < 0 ? -1 : th_sh(cmd, 240, out);
    free(cmd);
    free(bin);
    free(rekindle);
    return rc;
}

void th_elastic_grows_back(enum th_elastic how, bool in_place, const char *args, const char *lost_line)
{
    char *w = th_tmpdir("elastic-back"), *out = NULL;
    /* A host lost whole took mpirun's daemon with it: the growth onto it goes by a relaunch
       (tools/run_grow.c join_hosts), --grow inplace or not. */
    bool whole = how == TH_LOSE_HOST;
    int rc = th_train_elastic(w, 6000, args, how, in_place ? 1 + whole : 0, &out);
    const char *grown = in_place && !whole ? "grown in place to 3 workers" : "launching again to grow";
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n") && strstr(out, lost_line) && strstr(out, grown) &&
                      (!in_place || whole || !strstr(out, "launching again")),
                  "rc %d:\n%s", rc, out);
    th_job_equals_replay(out, 3, 6000);
    th_rmrf(w);
    free(w);
}
