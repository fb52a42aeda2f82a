/*
 * tests/test_write.c - the write path of a shard: the file allocated whole before its data
 * (formats/vfd_uring.c invariant 10), RK_IO=auto's measured choice, where it is kept and
 * when it is refused or measured again (formats/fio_probe.c P1-P6), RK_IO=uring/buffered
 * forcing the way, each with a fault in the middle (RK_FAULT); real jobs (tests/prog_ckpt)
 * for what a job shows: no torn checkpoint after a fault or a crash in the middle.
 * Every test keeps the measurement in a directory of its own (XDG_CACHE_HOME).
 */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../formats/fio.h"
#include "../formats/fmt.h"
#include "../formats/vfd_uring.h"
#include "common.h"
#include "harness.h"

#define MIB    ((size_t)1 << 20)
#define SECRET "0000000000000000000000000000000000000000000000000000000000000001"
#define S2     "step-000000000002"
#define S4     "step-000000000004"

/* ---- a test's directories, its environment, its log ---------------------------------------- */

typedef struct {
    char *dir, *cache, path[4200], cache_file[4200];
} scratch;

static scratch begin(const char *tag)
{
    scratch sc = {.dir = th_tmpdir(tag), .cache = th_tmpdir("xdg")};
    unsetenv("RK_FAULT");
    unsetenv("RK_FAULT_PATH");
    unsetenv("RK_IO");
    setenv("RK_LOG", "error", 1);
    setenv("XDG_CACHE_HOME", sc.cache, 1);
    rk__log_reload();
    rk__fault_reset();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    snprintf(sc.path, sizeof(sc.path), "%s/shard-0.h5", sc.dir);
    struct stat sb;
    ck_assert_int_eq(stat(sc.dir, &sb), 0);
    snprintf(sc.cache_file, sizeof(sc.cache_file), "%s/rekindle/io-%u-%u", sc.cache, major(sb.st_dev),
             minor(sb.st_dev));
    return sc;
}

static void end(scratch *sc)
{
    th_rmrf(sc->dir);
    th_rmrf(sc->cache);
    free(sc->dir);
    free(sc->cache);
}

static void faults(const char *spec, const char *path_filter)
{
    if (spec)
        setenv("RK_FAULT", spec, 1);
    else
        unsetenv("RK_FAULT");
    setenv("RK_FAULT_PATH", path_filter, 1);
    rk__fault_reset();
}

/* ---- a shard's tensors ------------------------------------------------------------------- */

/* 4 large tensors (16 MiB + 12, 5 MiB, 1 MiB + 3, 4097 bytes) and 300 small ones with long
   nested names: more metadata than one of the driver's 1 MiB metadata blocks holds. */
#define NBIG   4
#define NSMALL 300
static const size_t big_sizes[NBIG] = {16 * MIB + 12, 5 * MIB, MIB + 3, 4097};

static fmt_manifest *tensors(void)
{
    fmt_manifest *m = calloc(1, sizeof(*m));
    ck_assert_ptr_nonnull(m);
    *m = (fmt_manifest){
        .version = FMT_VERSION, .step = 4, .rank = 0, .world = 1, .nonce = 42, .n = NBIG + NSMALL};
    ck_assert_ptr_nonnull(m->t = calloc(m->n, sizeof(*m->t)));
    for (size_t i = 0; i < m->n; i++) {
        size_t nb = i < NBIG ? big_sizes[i] : 100 + i;
        char name[200];
        if (i < NBIG)
            snprintf(name, sizeof(name), "big/t%zu", i);
        else
            snprintf(name, sizeof(name), "layers/%zu/a_rather_long_parameter_name_as_models_have_them_%zu/w",
                     i % 7, i);
        unsigned char *d = NULL;
        ck_assert_int_eq(posix_memalign((void **)&d, 4096, nb), 0);
        th_pattern(d, nb, (unsigned)i);
        m->t[i] = (fmt_tensor){.name = strdup(name),
                               .dtype = RK_U8,
                               .ndim = 1,
                               .shape = {(int64_t)nb},
                               .nbytes = nb,
                               .order = (uint32_t)i,
                               .data = d};
    }
    return m;
}

static void tensors_free(fmt_manifest **m)
{
    for (size_t i = 0; i < (*m)->n; i++)
        free((void *)(*m)->t[i].data);
    fmt_manifest_free(m);
}

/* Every tensor read back with HDF5's own (sec2) driver, bitwise. */
static void check_shard(const char *path, const fmt_manifest *m)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_msg(f >= 0, "H5Fopen %s failed", path);
    for (size_t i = 0; i < m->n; i++) {
        hid_t d = H5Dopen2(f, m->t[i].name, H5P_DEFAULT);
        ck_assert_msg(d >= 0, "no dataset %s", m->t[i].name);
        unsigned char *got = malloc(m->t[i].nbytes);
        ck_assert_int_ge(H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, got), 0);
        ck_assert_msg(memcmp(got, m->t[i].data, m->t[i].nbytes) == 0, "%s differs", m->t[i].name);
        free(got);
        H5Dclose(d);
    }
    ck_assert_int_ge(H5Fclose(f), 0);
}

static uint64_t file_size(const char *path)
{
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    return (uint64_t)sb.st_size;
}

static int shard(const scratch *sc, const char *path, fmt_manifest *m, const char *io, fmt_write_stats *st)
{
    unlink(path);
    return fmt_shard_write(path, m, io, st);
}

/* ---- the shard allocated whole (vfd_uring.c invariant 10) --------------------------------- */

static const char *const ways[] = {"uring", "buffered"};

/* Invariant 10: the shard file is allocated whole (fallocate, to the estimate of its final
   size) before its first tensor's bytes, so that no raw-data write finds it too short
   (none sizes it again: before, every dataset's first write did, each waiting for the
   writes in flight); HDF5's truncation at close leaves it at its end of allocation; the
   tensors read back. A write failing in the middle (RK_FAULT write@middle=eio) fails the
   shard and finds the file already at its whole size. */
START_TEST(shard_allocated_whole_before_its_data)
{
    scratch sc = begin("whole");
    const char *io = ways[_i];
    fmt_manifest *m = tensors();
    fmt_write_stats st;
    faults(NULL, sc.dir);
    ck_assert_msg(shard(&sc, sc.path, m, io, &st) == 0, "%s", rk_last_error());
    uint64_t writes = rk__fault_count(RK_FAULT_OP_WRITE), size = file_size(sc.path);
    ck_assert_uint_eq(st.extends, 0);
    ck_assert_uint_ge(st.prealloc, size);
    ck_assert_uint_lt(st.prealloc - size, 4 * MIB);
    ck_assert_uint_eq(m->file.size, size);
    ck_assert_str_eq(st.io_auto, "");
    ck_assert_msg(strcmp(io, "buffered") == 0 ? strcmp(st.io_path, "buffered") == 0
                                              : strncmp(st.io_path, "uring", 5) == 0,
                  "RK_IO=%s: io_path %s", io, st.io_path);
    check_shard(sc.path, m);
    ck_assert_uint_gt(writes, 8);
    char spec[64], path[4300];
    snprintf(spec, sizeof(spec), "write@%llu=eio", (unsigned long long)(writes / 2));
    snprintf(path, sizeof(path), "%s/shard-1.h5", sc.dir);
    faults(spec, path);
    fmt_write_stats st2;
    ck_assert_int_eq(shard(&sc, path, m, io, &st2), -EIO);
    ck_assert_msg(file_size(path) == st.prealloc, "%s: %llu bytes, not the %llu allocated first", spec,
                  (unsigned long long)file_size(path), (unsigned long long)st.prealloc);
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* Invariant 10 and vfd_uring.c 5: the allocation itself failing (RK_FAULT truncate@0:
   fallocate counts as "truncate") fails the shard with that error before any tensor's byte
   is written: a full disk is found before the checkpoint's data is written. */
START_TEST(allocation_fault_fails_before_data)
{
    static const struct {
        const char *spec;
        int rc;
    } f[] = {{"truncate@0=enospc", -ENOSPC}, {"truncate@0=eio", -EIO}};
    scratch sc = begin("allocf");
    fmt_manifest *m = tensors();
    for (size_t w = 0; w < RK_ARRAY_LEN(ways); w++)
        for (size_t k = 0; k < RK_ARRAY_LEN(f); k++) {
            faults(f[k].spec, sc.path);
            fmt_write_stats st;
            int rc = shard(&sc, sc.path, m, ways[w], &st);
            ck_assert_msg(rc == f[k].rc, "RK_IO=%s %s: %d (%s)", ways[w], f[k].spec, rc, rk_strerror(rc));
            ck_assert_msg(file_size(sc.path) < MIB, "RK_IO=%s %s: %llu bytes written", ways[w], f[k].spec,
                          (unsigned long long)file_size(sc.path));
        }
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* ---- RK_IO=auto (fio_probe.c) ----------------------------------------------------------------- */

/* A kept measurement as fio_probe.c writes it, for the device of dir; fields given. */
static void keep(const scratch *sc, long age_s, const char *kernel, uint64_t fsid_xor, double d, double b,
                 const char *choice)
{
    struct statfs fs;
    struct utsname u;
    uint64_t fsid = 0;
    ck_assert_int_eq(statfs(sc->dir, &fs), 0);
    ck_assert_int_eq(uname(&u), 0);
    memcpy(&fsid, &fs.f_fsid, sizeof(fsid));
    char dir[4300], text[1024];
    snprintf(dir, sizeof(dir), "%s/rekindle", sc->cache);
    mkdir(dir, 0700);
    int n = snprintf(text, sizeof(text),
                     "rekindle-io 1\nfs %lx %llx\nkernel %s\ntime %lld\ndirect %.3f uring+odirect\nbuffered "
                     "%.3f\nchoice %s\n",
                     (unsigned long)fs.f_type, (unsigned long long)(fsid ^ fsid_xor),
                     kernel ? kernel : u.release, (long long)time(NULL) - age_s, d, b, choice);
    ck_assert_int_eq(th_write_file(sc->cache_file, text, (size_t)n), 0);
    ck_assert_int_eq(chmod(sc->cache_file, 0600), 0);
}

/* The choice of a kept measurement, "" if none is kept. */
static void kept_choice(const scratch *sc, char *choice, size_t cap)
{
    char *t = th_read_file(sc->cache_file, NULL), *c = t ? strstr(t, "\nchoice ") : NULL;
    snprintf(choice, cap, "%s", c ? c + 8 : "");
    choice[strcspn(choice, "\n")] = '\0';
    free(t);
}

static bool io_path_is(const char *io_path, const char *choice)
{
    return strcmp(choice, "buffered") == 0 ? strcmp(io_path, "buffered") == 0
                                           : strncmp(io_path, "uring", 5) == 0;
}

/* A real job (tests/prog_ckpt write 3: checkpoint 2) in a directory of its own on the
   device, RK_IO unset, its log at info; what it printed (malloc'd). */
static char *auto_job(const scratch *sc)
{
    char *ck = th_tmpdir("autojob"), e[3][4300], *out = NULL;
    snprintf(e[0], sizeof(e[0]), "RK_CKPT_DIR=%s", ck);
    snprintf(e[1], sizeof(e[1]), "XDG_CACHE_HOME=%s", sc->cache);
    snprintf(e[2], sizeof(e[2]), "RK_EVENT_LOG=%s/events", ck);
    const char *env[] = {
        e[0], e[1], e[2], "RK_CKPT_EVERY=2", "RK_LOG=info", "RK_LOG_SUBSYS=fmt", "RK_JOB_SECRET=" SECRET, NULL};
    char *prog = th_bin("../tests/prog_ckpt"), *argv[] = {prog, "write", "3", "7", NULL};
    int rc = th_run(argv, env, 60, &out);
    ck_assert_msg(rc == 0 && th_exists(ck, S2), "exit %d: %s", rc, out);
    /* the choice is an event, once: measured false where the job read the kept figures */
    char evpath[4400];
    snprintf(evpath, sizeof(evpath), "%s/events.0", ck);
    char *ev = th_read_file(evpath, NULL);
    ck_assert_msg(ev != NULL, "no event log %s", evpath);
    const char *at = strstr(ev, "\"event\": \"io_chosen\"");
    bool kept = strstr(out, "measured before") != NULL;
    ck_assert_msg(at && !strstr(at + 1, "\"event\": \"io_chosen\"") &&
                      strstr(at, kept ? "\"measured\": false" : "\"measured\": true"),
                  "io_chosen once, measured %s: %s", kept ? "false" : "true", ev);
    free(ev);
    free(prog);
    th_rmrf(ck);
    free(ck);
    return out;
}

/* P1, P2, P6: RK_IO=auto measures the directory's device at its first use, chooses by the
   figures (buffered only when more than 10% faster), keeps them (0600, in the directory of
   XDG_CACHE_HOME) and writes the shard that way; the next write of the process uses the
   choice without measuring. A new process (a real job) reads the kept measurement and says
   so in its log and, once, in the event io_chosen. */
START_TEST(auto_measures_once_and_keeps)
{
    scratch sc = begin("auto");
    fmt_manifest *m = tensors();
    fmt_write_stats st;
    ck_assert_msg(shard(&sc, sc.path, m, "auto", &st) == 0, "%s", rk_last_error());
    ck_assert(st.auto_measured && st.auto_first);
    ck_assert_msg(st.auto_direct_gbs > 0 && st.auto_buffered_gbs > 0, "figures %.3f %.3f", st.auto_direct_gbs,
                  st.auto_buffered_gbs);
    const char *want = st.auto_buffered_gbs > st.auto_direct_gbs * 1.10 ? "buffered" : "uring";
    ck_assert_str_eq(st.io_auto, want);
    ck_assert_msg(io_path_is(st.io_path, want), "chose %s, wrote through %s", want, st.io_path);
    char choice[32];
    kept_choice(&sc, choice, sizeof(choice));
    ck_assert_str_eq(choice, want);
    struct stat sb;
    ck_assert_int_eq(stat(sc.cache_file, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    check_shard(sc.path, m);
    fmt_write_stats st2;
    ck_assert_int_eq(shard(&sc, sc.path, m, "auto", &st2), 0);
    ck_assert(!st2.auto_measured && !st2.auto_first);
    ck_assert_str_eq(st2.io_auto, want);
    ck_assert_msg(th_dot_entries(sc.dir) == 0, "the probe's files are left in %s", sc.dir);

    char *out = auto_job(&sc); /* a new process: it reads what was kept */
    ck_assert_msg(strstr(out, "measured before, kept in ") && strstr(out, sc.cache_file) &&
                      !strstr(out, "measured now"),
                  "the job did not read the kept measurement: %s", out);
    free(out);
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* P1, P5: auto writes the way the kept figures chose; RK_IO=uring and RK_IO=buffered force
   their way, and neither measures, reads nor writes the cache. */
static const struct {
    const char *kept, *rk_io, *io_path_of;
} forced[] = {
    {"buffered", NULL, "buffered"}, {"uring", NULL, "uring"},          {"buffered", "auto", "buffered"},
    {"buffered", "uring", "uring"}, {"uring", "buffered", "buffered"}, {NULL, "buffered", "buffered"},
    {NULL, "uring", "uring"},
};

START_TEST(auto_follows_the_kept_figures_rk_io_forces)
{
    scratch sc = begin("forced");
    fmt_manifest *m = tensors();
    if (forced[_i].kept)
        keep(&sc, 60, NULL, 0, strcmp(forced[_i].kept, "uring") == 0 ? 2.0 : 0.5,
             strcmp(forced[_i].kept, "uring") == 0 ? 0.5 : 2.0, forced[_i].kept);
    char *before = th_read_file(sc.cache_file, NULL);
    if (forced[_i].rk_io)
        setenv("RK_IO", forced[_i].rk_io, 1);
    fmt_write_stats st;
    ck_assert_msg(shard(&sc, sc.path, m, "auto", &st) == 0, "%s", rk_last_error());
    ck_assert_msg(io_path_is(st.io_path, forced[_i].io_path_of), "kept %s, RK_IO=%s: io_path %s",
                  forced[_i].kept ? forced[_i].kept : "nothing",
                  forced[_i].rk_io ? forced[_i].rk_io : "(unset)", st.io_path);
    ck_assert(!st.auto_measured);
    bool forcing = forced[_i].rk_io && strcmp(forced[_i].rk_io, "auto") != 0;
    ck_assert_str_eq(st.io_auto, forcing ? "" : forced[_i].kept);
    char *after = th_read_file(sc.cache_file, NULL);
    ck_assert_msg((before == NULL) == (after == NULL) && (!before || strcmp(before, after) == 0),
                  "the kept measurement changed or appeared");
    free(before);
    free(after);
    check_shard(sc.path, m);
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* P2: a kept measurement that is stale (8 days old, from the future, of another kernel, of
   another file system under the same device number) or malformed is measured again and
   replaced. */
static const struct {
    long age_s;
    const char *kernel;
    uint64_t fsid_xor;
    bool malformed;
} stale[] = {{8L * 24 * 3600, NULL, 0, false},
             {-3600, NULL, 0, false},
             {60, "0.0.1-another", 0, false},
             {60, NULL, 0x10, false},
             {60, NULL, 0, true}};

START_TEST(stale_measured_again)
{
    scratch sc = begin("stale");
    fmt_manifest *m = tensors();
    keep(&sc, stale[_i].age_s, stale[_i].kernel, stale[_i].fsid_xor, 0.5, 2.0, "buffered");
    if (stale[_i].malformed)
        ck_assert_int_eq(th_write_file(sc.cache_file, "rekindle-io 1\nchoice buffered\n", 30), 0);
    fmt_write_stats st;
    ck_assert_msg(shard(&sc, sc.path, m, "auto", &st) == 0, "%s", rk_last_error());
    ck_assert_msg(st.auto_measured, "case %d: the stale measurement was used", _i);
    char *t = th_read_file(sc.cache_file, NULL);
    struct utsname u;
    ck_assert_int_eq(uname(&u), 0);
    ck_assert_msg(t && strstr(t, u.release) && strstr(t, "\nchoice ") && !strstr(t, "direct 0.500"),
                  "case %d: not replaced: %s", _i, t ? t : "(none)");
    free(t);
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* P3: the kept measurement is refused when it is a symbolic link, another user's file, a
   file open to group or other writes, or in a directory that is a link: logged, measured
   anyway, and nothing written through it. */
enum refusal { R_LINK, R_OTHER_USER, R_GROUP_WRITABLE, R_DIR_LINK };

START_TEST(cache_refused_link_or_other_users)
{
    scratch sc = begin("refuse");
    fmt_manifest *m = tensors();
    char target[4300], dir[4300];
    snprintf(target, sizeof(target), "%s/elsewhere", sc.dir);
    snprintf(dir, sizeof(dir), "%s/rekindle", sc.cache);
    keep(&sc, 60, NULL, 0, 0.5, 2.0, "buffered"); /* a fresh one, choosing buffered */
    switch ((enum refusal)_i) {
    case R_LINK:
        ck_assert_int_eq(rename(sc.cache_file, target), 0);
        ck_assert_int_eq(symlink(target, sc.cache_file), 0);
        break;
    case R_OTHER_USER:
        if (geteuid() != 0) {
            fprintf(stderr,
                    "cache_refused_link_or_other_users: not root, no other user's file: case skipped\n");
            goto out;
        }
        ck_assert_int_eq(chown(sc.cache_file, 65534, 65534), 0);
        snprintf(target, sizeof(target), "%s", sc.cache_file);
        break;
    case R_GROUP_WRITABLE:
        ck_assert_int_eq(chmod(sc.cache_file, 0620), 0);
        snprintf(target, sizeof(target), "%s", sc.cache_file);
        break;
    case R_DIR_LINK:
        ck_assert_int_eq(rename(dir, target), 0);
        ck_assert_int_eq(symlink(target, dir), 0);
        strcat(target, strrchr(sc.cache_file, '/'));
        break;
    }
    char *before = th_read_file(target, NULL);
    ck_assert_ptr_nonnull(before);
    th_capture c;
    th_capture_begin(&c);
    setenv("RK_LOG", "warn", 1);
    rk__log_reload();
    fmt_write_stats st;
    int rc = shard(&sc, sc.path, m, "auto", &st);
    char *log = th_capture_end(&c);
    ck_assert_msg(rc == 0, "%s", rk_last_error());
    ck_assert_msg(st.auto_measured, "case %d: the refused measurement was used (%s)", _i, st.io_path);
    ck_assert_msg(strstr(log, "refusing the kept measurement"), "case %d: nothing logged: %s", _i, log);
    char *after = th_read_file(target, NULL);
    ck_assert_msg(after && strcmp(before, after) == 0, "case %d: written through: %s", _i,
                  after ? after : "");
    free(log);
    free(before);
    free(after);
    check_shard(sc.path, m);
out:
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* P1: a crash in the middle of the measurement (a child killed at its middle write) keeps
   nothing; the measurement failing in the middle (RK_FAULT write@middle=eio on the probe's
   files) chooses uring, is logged, is not kept, and the shard is written and whole; the
   next process (a real job) measures again and keeps it. */
START_TEST(probe_fault_in_the_middle_keeps_nothing)
{
    scratch sc = begin("probef");
    fmt_manifest *m = tensors();
    fmt_write_stats st;
    pid_t pid = fork(); /* a clean measurement in a child, to count the probe's writes */
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        faults(NULL, ".rekindle-io-probe");
        if (shard(&sc, sc.path, m, "auto", &st) != 0 || !st.auto_measured)
            _exit(3);
        _exit((int)(rk__fault_count(RK_FAULT_OP_WRITE) / 2 > 250 ? 250
                                                                 : rk__fault_count(RK_FAULT_OP_WRITE) / 2));
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) > 4, "status %#x", status);
    int mid = WEXITSTATUS(status);
    unlink(sc.cache_file);
    char spec[64], choice[32];
    snprintf(spec, sizeof(spec), "write@%d=crash", mid);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        faults(spec, ".rekindle-io-probe");
        shard(&sc, sc.path, m, "auto", &st);
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "%s: child status %#x", spec, status);
    kept_choice(&sc, choice, sizeof(choice));
    ck_assert_msg(choice[0] == '\0', "kept after a crash in the measurement: %s", choice);

    snprintf(spec, sizeof(spec), "write@%d=eio", mid);
    faults(spec, ".rekindle-io-probe");
    setenv("RK_LOG", "warn", 1);
    rk__log_reload();
    th_capture c;
    th_capture_begin(&c);
    int rc = shard(&sc, sc.path, m, "auto", &st);
    char *log = th_capture_end(&c);
    ck_assert_msg(rc == 0, "%s", rk_last_error());
    ck_assert_str_eq(st.io_auto, "uring");
    ck_assert_msg(strncmp(st.io_path, "uring", 5) == 0, "io_path %s", st.io_path);
    ck_assert_msg(strstr(log, "measuring") && strstr(log, "failed"), "not logged: %s", log);
    free(log);
    kept_choice(&sc, choice, sizeof(choice));
    ck_assert_msg(choice[0] == '\0', "kept after a failed measurement: %s", choice);
    check_shard(sc.path, m);
    faults(NULL, "-"); /* the next process (a real job) measures again and keeps it */
    char *out = auto_job(&sc);
    ck_assert_msg(strstr(out, "measured now"), "the job did not measure: %s", out);
    kept_choice(&sc, choice, sizeof(choice));
    ck_assert_msg(choice[0], "not kept after a clean measurement");
    free(out);
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* P1: where io_uring is refused (RK_FAULT uring@*=eperm: a seccomp filter), RK_IO=auto,
   whether it measures now or reads a kept choice of uring, falls back to the buffered
   path loudly and writes the shard, as the driver's own fallback does (vfd_uring.c). */
START_TEST(auto_without_io_uring_falls_back)
{
    scratch sc = begin("nouring");
    fmt_manifest *m = tensors();
    if (_i == 1)
        keep(&sc, 60, NULL, 0, 2.0, 0.5, "uring");
    faults("uring@*=eperm", sc.dir);
    setenv("RK_LOG", "warn", 1);
    rk__log_reload();
    th_capture c;
    th_capture_begin(&c);
    fmt_write_stats st;
    int rc = shard(&sc, sc.path, m, "auto", &st);
    char *log = th_capture_end(&c);
    ck_assert_msg(rc == 0, "case %d: %s", _i, rk_last_error());
    ck_assert_str_eq(st.io_path, "buffered");
    ck_assert_msg(strstr(log, "io_uring unavailable"), "case %d: the fallback was not logged: %s", _i, log);
    free(log);
    check_shard(sc.path, m);
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* P4: while another process holds the device's cache (it measures), a writer waits for it
   and then uses what it kept, without measuring the disk a second time. */
START_TEST(one_process_measures_the_others_wait)
{
    scratch sc = begin("lock");
    fmt_manifest *m = tensors();
    char dir[4300];
    snprintf(dir, sizeof(dir), "%s/rekindle", sc.cache);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    int fd = open(sc.cache_file, O_RDWR | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(flock(fd, LOCK_EX), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fd);
        fmt_write_stats st;
        int rc = shard(&sc, sc.path, m, "auto", &st);
        _exit(rc != 0 ? 3 : st.auto_measured ? 4 : strcmp(st.io_path, "buffered") != 0 ? 5 : 0);
    }
    usleep(300 * 1000); /* the child is waiting by now (were it not, it still must not measure) */
    keep(&sc, 0, NULL, 0, 0.5, 2.0, "buffered");
    flock(fd, LOCK_UN);
    close(fd);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child status %#x (4: it measured while another held the cache, 5: not the kept choice)",
                  status);
    tensors_free(&m);
    end(&sc);
}
END_TEST

/* ---- what Python declares of it ------------------------------------------------------------ */

/* python/rekindle/dcp.py hands fmt_shard_write a manifest and a fmt_write_stats declared
   field for field with ctypes: each must be as large as the C struct, or the writer reads
   and writes past what Python allocated (the stats grew with io_auto's fields). The
   declarations are taken from the file and sized by RK_TEST_PYTHON, without importing the
   module (which needs torch 2.x). */
START_TEST(dcp_py_declares_the_structs_whole)
{
    static const struct {
        const char *cls;
        size_t size;
    } decl[] = {{"_FmtWriteStats", sizeof(fmt_write_stats)}, {"_FmtManifest", sizeof(fmt_manifest)}};
    const char *py = getenv("RK_TEST_PYTHON"), *src = getenv("RK_TEST_SRC");
    char path[4200];
    snprintf(path, sizeof(path), "%s/python/rekindle/dcp.py", src ? src : ".");
    const char *script =
        "import ctypes, re, sys\n"
        "s = open(sys.argv[1]).read(); ns = {'ctypes': ctypes, '_P': ctypes.c_void_p}\n"
        "for c in ('_FmtTensor', sys.argv[2]):\n"
        "    m = re.search(r'^class %s\\(ctypes.Structure\\):\\n(?:    .*\\n)+' % c, s, re.M)\n"
        "    exec(m.group(0), ns)\n"
        "print(ctypes.sizeof(ns[sys.argv[2]]))\n";
    for (size_t k = 0; k < RK_ARRAY_LEN(decl); k++) {
        char *argv[] = {
            (char *)(py ? py : "/usr/bin/python3"), "-c", (char *)script, path, (char *)decl[k].cls, NULL};
        char *out = NULL;
        int rc = th_run(argv, NULL, 60, &out);
        ck_assert_msg(rc == 0, "%s: exit %d: %s", decl[k].cls, rc, out ? out : "");
        ck_assert_msg(strtoul(out, NULL, 10) == decl[k].size, "dcp.py's %s is %s bytes, the C struct %zu",
                      decl[k].cls, out, decl[k].size);
        free(out);
    }
}
END_TEST

/* ---- real jobs: a fault or a crash in the middle of a shard ------------------------------- */

static int job(const char *prog, const char *dir, const char *cache, const char *io, const char *fault,
               const char *mode, const char *steps, char **out)
{
    char e[5][4300];
    snprintf(e[0], sizeof(e[0]), "RK_CKPT_DIR=%s", dir);
    snprintf(e[1], sizeof(e[1]), "XDG_CACHE_HOME=%s", cache);
    snprintf(e[2], sizeof(e[2]), "RK_IO=%s", io);
    snprintf(e[3], sizeof(e[3]), "RK_FAULT=%s", fault ? fault : "");
    snprintf(e[4], sizeof(e[4]), "RK_FAULT_PATH=%s", fault ? "/.tmp-step-000000000004" : "");
    const char *env[] = {e[0],
                         e[1],
                         e[2],
                         e[3],
                         e[4],
                         "RK_CKPT_EVERY=2",
                         "RK_KEEP=3",
                         "RK_TIMEOUT_MS=20000",
                         "RK_JOB_SECRET=" SECRET,
                         NULL};
    char *argv[] = {(char *)prog, (char *)mode, (char *)steps, "7", "big", NULL};
    return th_run(argv, env, 60, out);
}

/* The count of `op` a job printed ("rank 0 ops ... op=N ..."). */
static long ops_of(const char *out, const char *op)
{
    char key[32];
    snprintf(key, sizeof(key), " %s=", op);
    const char *p = strstr(out, "ops");
    p = p ? strstr(p, key) : NULL;
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* Writer W1 on the new paths (RK_IO=uring, buffered, auto): checkpoint 4's shard cut in the
   middle of its writes, by an error (the job reports the failure) and by a crash (the job
   is killed), and at its allocation: nothing named step-…4, checkpoint 2 verifies and a
   relaunch restores it bitwise. */
START_TEST(job_cut_in_the_middle_commits_nothing_torn)
{
    static const char *const io[] = {"uring", "buffered", "auto"};
    char *base = th_tmpdir("cut"), *cache = th_tmpdir("xdg"), *out = NULL;
    char *prog = th_bin("../tests/prog_ckpt"), *cli = th_bin("rekindle");
    int rc = job(prog, base, cache, io[_i], NULL, "write", "3", &out);
    ck_assert_msg(rc == 0 && th_exists(base, S2), "exit %d: %s", rc, out);
    free(out);
    char *dir = th_tmpdir("cut-count"), cmd[9000];
    snprintf(cmd, sizeof(cmd), "cp -a '%s'/. '%s'/", base, dir);
    ck_assert_int_eq(th_sh(cmd, 30, NULL), 0);
    rc = job(prog, dir, cache, io[_i], "write@999999=eio", "continue", "5",
             &out); /* counts, injects nothing */
    long writes = ops_of(out, "write");
    ck_assert_msg(rc == 0 && writes > 4, "exit %d, %ld writes: %s", rc, writes, out);
    free(out);
    th_rmrf(dir);
    free(dir);
    char cuts[3][64];
    snprintf(cuts[0], sizeof(cuts[0]), "write@%ld=eio", writes / 2);
    snprintf(cuts[1], sizeof(cuts[1]), "write@%ld=crash", writes / 2);
    snprintf(cuts[2], sizeof(cuts[2]), "truncate@0=enospc");
    for (int k = 0; k < 3; k++) {
        dir = th_tmpdir("cut-run");
        snprintf(cmd, sizeof(cmd), "cp -a '%s'/. '%s'/", base, dir);
        ck_assert_int_eq(th_sh(cmd, 30, NULL), 0);
        rc = job(prog, dir, cache, io[_i], cuts[k], "continue", "5", &out);
        ck_assert_msg(k == 1 ? rc == 128 + SIGKILL : rc == 3, "RK_IO=%s %s: exit %d: %s", io[_i], cuts[k], rc,
                      out);
        free(out);
        ck_assert_msg(!th_exists(dir, S4) && th_exists(dir, S2),
                      "RK_IO=%s %s: step-4 committed or step-2 gone", io[_i], cuts[k]);
        char *vargv[] = {cli, "verify", dir, "--all", NULL};
        rc = th_run(vargv, NULL, 60, &out);
        ck_assert_msg(rc == 0, "RK_IO=%s %s: rekindle verify --all: exit %d: %s", io[_i], cuts[k], rc, out);
        free(out);
        rc = job(prog, dir, cache, io[_i], NULL, "resume", "2", &out);
        ck_assert_msg(rc == 0, "RK_IO=%s %s: resume 2: exit %d: %s", io[_i], cuts[k], rc, out);
        free(out);
        th_rmrf(dir);
        free(dir);
    }
    th_rmrf(base);
    th_rmrf(cache);
    free(base);
    free(cache);
    free(prog);
    free(cli);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("write");
    TCase *tc = tcase_create("shard");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, shard_allocated_whole_before_its_data, 0, (int)RK_ARRAY_LEN(ways));
    tcase_add_test(tc, allocation_fault_fails_before_data);
    suite_add_tcase(s, tc);
    tc = tcase_create("auto");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, auto_measures_once_and_keeps);
    tcase_add_loop_test(tc, auto_follows_the_kept_figures_rk_io_forces, 0, (int)RK_ARRAY_LEN(forced));
    tcase_add_loop_test(tc, stale_measured_again, 0, (int)RK_ARRAY_LEN(stale));
    tcase_add_loop_test(tc, cache_refused_link_or_other_users, 0, R_DIR_LINK + 1);
    tcase_add_test(tc, probe_fault_in_the_middle_keeps_nothing);
    tcase_add_test(tc, one_process_measures_the_others_wait);
    tcase_add_loop_test(tc, auto_without_io_uring_falls_back, 0, 2);
    tcase_add_test(tc, dcp_py_declares_the_structs_whole);
    suite_add_tcase(s, tc);
    tc = tcase_create("job");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, job_cut_in_the_middle_commits_nothing_torn, 0, 3);
    suite_add_tcase(s, tc);
    return th_main(s);
}
