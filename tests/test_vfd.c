/*
 * tests/test_vfd.c - the checkpoint I/O path of formats/: the fault-injectable file
 * operations (fio.h), the HDF5 driver over io_uring + O_DIRECT (vfd_uring.h), and the
 * reader of a checkpoint's tensors (fmt_read.c, fmt_readdirect.c) on crafted manifests.
 * Invariant numbers refer to the header of formats/vfd_uring.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../formats/fio.h"
#include "../formats/fmt.h"
#include "../formats/vfd_uring.h"
#include "common.h"
#include "harness.h"

#define MIB ((size_t)1 << 20)

static void clear_env(void)
{
    unsetenv("RK_FAULT");
    unsetenv("RK_FAULT_PATH");
    unsetenv("RK_IO");
    unsetenv("RK_LOG");
    rk__log_reload();
    rk__fault_reset();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

/* Faults as spec says (none when NULL) on path alone, quiet logs, counts from zero. */
static void fault_env(const char *path, const char *spec)
{
    if (spec)
        setenv("RK_FAULT", spec, 1);
    else
        unsetenv("RK_FAULT");
    setenv("RK_FAULT_PATH", path, 1);
    setenv("RK_LOG", "error", 1);
    rk__log_reload();
    rk__fault_reset();
}

static void *alloc_aligned(size_t n)
{
    void *p = NULL;
    ck_assert_int_eq(posix_memalign(&p, 4096, n ? n : 1), 0);
    return p;
}

/* ---- writing and reading test files ------------------------------------------------------- */

typedef struct {
    const size_t *sizes;
    int n;
    bool aligned; /* page-aligned source buffers (zero copy possible), else never page-aligned */
} layout;

/* A source buffer of n bytes, page-aligned or 8 bytes past a page boundary (not malloc, whose
   large blocks may be page-aligned: ThreadSanitizer's are). */
static unsigned char *src_alloc(size_t n, bool aligned)
{
    return (unsigned char *)alloc_aligned(n + (aligned ? 0 : 8)) + (aligned ? 0 : 8);
}

static void src_free(unsigned char *p, bool aligned)
{
    if (p)
        free(p - (aligned ? 0 : 8));
}

/* Writes datasets d0..d<n-1> (u8, contiguous, early allocation, no fill) through fapl.
   Returns 0, or -1 if any HDF5 call failed (also H5Dwrite or H5Fclose), after cleaning up. */
static int write_file(const char *path, hid_t fapl, const layout *l)
{
    int bad = 0;
    unsigned char **bufs = calloc((size_t)l->n, sizeof *bufs);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (f < 0) {
        free(bufs);
        return -1;
    }
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    for (int k = 0; k < l->n; k++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", k);
        hsize_t dim = l->sizes[k];
        hid_t sp = H5Screate_simple(1, &dim, NULL);
        hid_t d = H5Dcreate2(f, name, H5T_NATIVE_UINT8, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        bufs[k] = src_alloc(l->sizes[k], l->aligned);
        th_pattern(bufs[k], l->sizes[k], (unsigned)k);
        if (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bufs[k]) < 0)
            bad = -1;
        if (d >= 0)
            H5Dclose(d);
        H5Sclose(sp);
    }
    H5Pclose(dcpl);
    if (fmt_vfd_close(&f) < 0)
        bad = -1;
    /* Buffers stay untouched until H5Fclose returned (zero copy). */
    for (int k = 0; k < l->n; k++)
        src_free(bufs[k], l->aligned);
    free(bufs);
    return bad;
}

/* Reads every dataset through fapl and compares it byte for byte. */
static void check_file(const char *path, hid_t fapl, const layout *l)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    ck_assert_msg(f >= 0, "H5Fopen %s failed", path);
    for (int k = 0; k < l->n; k++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", k);
        hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
        ck_assert_msg(d >= 0, "no dataset %s", name);
        hid_t sp = H5Dget_space(d);
        ck_assert_int_eq(H5Sget_simple_extent_npoints(sp), (hssize_t)l->sizes[k]);
        H5Sclose(sp);
        unsigned char *want = malloc(l->sizes[k] + 1), *got = malloc(l->sizes[k] + 1);
        th_pattern(want, l->sizes[k], (unsigned)k);
        memset(got, 0xA5, l->sizes[k]);
        ck_assert_int_ge(H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, got), 0);
        ck_assert_msg(memcmp(want, got, l->sizes[k]) == 0, "%s: dataset %s (%zu bytes) differs", path, name,
                      l->sizes[k]);
        free(want);
        free(got);
        H5Dclose(d);
    }
    ck_assert_int_ge(H5Fclose(f), 0);
}

/* Reads every dataset with /usr/bin/python3 + h5py and compares. */
static void check_h5py(const char *path, const layout *l)
{
    const char *py = getenv("RK_TEST_PYTHON");
    char out[600], n[16];
    snprintf(out, sizeof out, "%s.py.bin", path);
    snprintf(n, sizeof n, "%d", l->n);
    const char *script = "import h5py, sys\n"
                         "f = h5py.File(sys.argv[1], 'r'); o = open(sys.argv[2], 'wb')\n"
                         "for k in range(int(sys.argv[3])): o.write(f['d%d' % k][()].tobytes())\n";
    char *argv[] = {(char *)(py ? py : "/usr/bin/python3"), "-c", (char *)script, (char *)path, out, n, NULL};
    char *log = NULL;
    int rc = th_run(argv, NULL, 60, &log);
    ck_assert_msg(rc == 0, "h5py could not read %s (rc %d): %s", path, rc, log ? log : "");
    free(log);
    size_t len, off = 0;
    unsigned char *all = (unsigned char *)th_read_file(out, &len);
    ck_assert_ptr_nonnull(all);
    for (int k = 0; k < l->n; k++) {
        unsigned char *want = malloc(l->sizes[k] + 1);
        th_pattern(want, l->sizes[k], (unsigned)k);
        ck_assert_uint_le(off + l->sizes[k], len);
        ck_assert_msg(memcmp(want, all + off, l->sizes[k]) == 0, "h5py: dataset d%d differs", k);
        off += l->sizes[k];
        free(want);
    }
    ck_assert_uint_eq(off, len);
    free(all);
    unlink(out);
}

static char *tmpfile_in(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* A test's scratch directory and file, with the environment cleared. */
typedef struct {
    char *dir, *path;
} scratch;

static scratch scratch_begin(const char *tag, const char *name)
{
    clear_env();
    scratch sc = {.dir = th_tmpdir(tag)};
    sc.path = tmpfile_in(sc.dir, name);
    return sc;
}

static void scratch_end(scratch *sc)
{
    clear_env();
    th_rmrf(sc->dir);
    free(sc->path);
    free(sc->dir);
}

static const size_t odd_sizes[] = {1, 4095, 4097, MIB + 12, 16 * MIB + 12, 100000, 65536, 3 * 4096};
#define N_ODD ((int)RK_ARRAY_LEN(odd_sizes))

/* ---- fio --------------------------------------------------------------------------------- */

START_TEST(fio_wrappers_and_counts)
{
    clear_env();
    char *dir = th_tmpdir("fio");
    char *p = tmpfile_in(dir, "a");
    int fd = fmt_io_open(p, O_RDWR | O_CREAT, 0644);
    ck_assert_int_ge(fd, 0);
    char buf[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = (char)i;
    th_assert_rc(fmt_io_pwrite_all(fd, buf, sizeof buf, 10, p), 0);
    th_assert_rc(fmt_io_pread_all(fd, back, sizeof back, 10, p), 0);
    ck_assert_int_eq(memcmp(buf, back, sizeof buf), 0);
    th_assert_rc(fmt_io_pread_all(fd, back, sizeof back, 20, p), -EIO); /* EOF */
    th_assert_rc(fmt_io_fsync(fd, p), 0);
    th_assert_rc(fmt_io_ftruncate(fd, 4, p), 0);
    ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_WRITE), 1);
    ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_READ), 2);
    ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_SYNC), 1);
    ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_OPEN), 1);

    /* Injected: second write ENOSPC, every sync EIO, first read short. */
    setenv("RK_FAULT", "write@1=enospc,sync@*=eio,read@0=short", 1);
    th_assert_rc(rk__fault_reset(), 0);
    th_assert_rc(fmt_io_pwrite_all(fd, buf, sizeof buf, 0, p), 0);
    th_assert_rc(fmt_io_pwrite_all(fd, buf, sizeof buf, 0, p), -ENOSPC);
    th_assert_rc(fmt_io_pwrite_all(fd, buf, sizeof buf, 0, p), 0);
    th_assert_rc(fmt_io_fsync(fd, p), -EIO);
    th_assert_rc(fmt_io_fsync(fd, p), -EIO);
    memset(back, 0, sizeof back);
    th_assert_rc(fmt_io_pread_all(fd, back, sizeof back, 0, p), -EIO);
    ck_assert_int_eq(memcmp(buf, back, 500), 0); /* the first half arrived */
    ck_assert_int_eq(back[500], 0);

    /* A short write moves half and fails; RK_FAULT_PATH limits faults (and counts). */
    setenv("RK_FAULT", "write@*=short", 1);
    setenv("RK_FAULT_PATH", "/nomatch/", 1);
    th_assert_rc(rk__fault_reset(), 0);
    th_assert_rc(fmt_io_pwrite_all(fd, buf, sizeof buf, 0, p), 0);
    ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_WRITE), 0);
    unsetenv("RK_FAULT_PATH");
    rk__fault_reset();
    th_assert_rc(ftruncate(fd, 0), 0);
    th_assert_rc(fmt_io_pwrite_all(fd, buf, sizeof buf, 0, p), -EIO);
    struct stat sb;
    fstat(fd, &sb);
    ck_assert_int_eq(sb.st_size, 500);

    /* "any" counts over every kind. */
    setenv("RK_FAULT", "any@2=eio", 1);
    rk__fault_reset();
    th_assert_rc(fmt_io_fsync(fd, p), 0);
    th_assert_rc(fmt_io_pwrite_all(fd, buf, 1, 0, p), 0);
    th_assert_rc(fmt_io_unlink("/nonexistent-rk"), -EIO);
    close(fd);
    clear_env();
    th_rmrf(dir);
    free(p);
    free(dir);
}
END_TEST

static const char *const bad_specs[] = {"write@x=eio", "bogus", "write@1=boom", "write@-1=eio", "write@1",
                                        "fly@1=eio", "write@1=eio,,"};

START_TEST(fio_bad_spec_ignored_with_log)
{
    clear_env();
    setenv("RK_FAULT", bad_specs[_i], 1);
    th_capture c;
    th_capture_begin(&c);
    int rc = rk__fault_reset();
    char *log = th_capture_end(&c);
    th_assert_rc(rc, RK_E_OPTION);
    ck_assert_msg(strstr(log, "RK_FAULT") != NULL, "no log line naming RK_FAULT: '%s'", log);
    free(log);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(fmt_fault(RK_FAULT_OP_WRITE, "/x"), 0);
    clear_env();
}
END_TEST

START_TEST(fio_crash_before_rename)
{
    clear_env();
    char *dir = th_tmpdir("crash");
    char *a = tmpfile_in(dir, "a"), *b = tmpfile_in(dir, "b");
    th_write_file(a, "x", 1);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("RK_FAULT", "rename@0=crash", 1);
        rk__fault_reset();
        fmt_io_rename(a, b);
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %#x, want SIGKILL", status);
    ck_assert_int_eq(access(a, F_OK), 0);
    ck_assert_int_ne(access(b, F_OK), 0);
    th_assert_rc(fmt_io_rename(a, b), 0);
    th_rmrf(dir);
    free(a);
    free(b);
    free(dir);
}
END_TEST

/* ---- round trips ---------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int qd;
    bool zero_copy, aligned;
} rt_cfg[] = {
    {"staged qd16", 0, false, false},
    {"zero-copy qd16", 0, true, true},
    {"staged qd1", 1, false, true},
    {"zero-copy qd32", 32, true, true},
    {"zero-copy, unaligned buffers", 8, true, false},
};

/* Invariants 1, 3, 6: odd sizes round-trip through the driver, sec2 and h5py. */
START_TEST(roundtrip_odd_sizes)
{
    scratch sc = scratch_begin("rt", "rt.h5");
    const char *path = sc.path;
    fmt_vfd_stats st;
    fmt_vfd_opts o = {.queue_depth = rt_cfg[_i].qd, .zero_copy = rt_cfg[_i].zero_copy, .stats = &st};
    hid_t fapl = fmt_vfd_fapl(&o);
    ck_assert_int_ge(fapl, 0);
    layout l = {odd_sizes, N_ODD, rt_cfg[_i].aligned};
    th_capture c;
    th_capture_begin(&c);
    int rc = write_file(path, fapl, &l);
    char *log = th_capture_end(&c);
    ck_assert_msg(rc == 0, "%s: write failed", rt_cfg[_i].name);
    ck_assert_msg(log[0] == '\0', "the success path printed: '%s'", log);
    free(log);
    ck_assert_str_eq(st.io_path, "uring+odirect");
    th_assert_rc(st.error, 0);
    size_t total = 0;
    for (int k = 0; k < N_ODD; k++)
        total += odd_sizes[k];
    ck_assert_uint_gt(st.bytes_direct, total * 9 / 10);
    ck_assert_uint_le(st.max_inflight, rt_cfg[_i].qd ? (uint64_t)rt_cfg[_i].qd : rt_cfg[_i].zero_copy ? 32 : 16);
    if (rt_cfg[_i].qd != 1)
        ck_assert_uint_gt(st.max_inflight, 1);
    if (rt_cfg[_i].zero_copy && rt_cfg[_i].aligned)
        ck_assert_uint_gt(st.bytes_zero_copy, 16 * MIB);
    else
        ck_assert_uint_eq(st.bytes_zero_copy, 0);

    check_file(path, fapl, &l);
    ck_assert_uint_gt(st.bytes_read_direct, 16 * MIB);
    check_file(path, H5P_DEFAULT, &l);
    if (_i == 0 || _i == 3)
        check_h5py(path, &l);
    H5Pclose(fapl);
    scratch_end(&sc);
}
END_TEST

/* The driver reads files written by HDF5's default driver (unaligned raw data). */
START_TEST(reads_sec2_files)
{
    scratch sc = scratch_begin("sec2", "s.h5");
    const char *path = sc.path;
    layout l = {odd_sizes, N_ODD, false};
    ck_assert_int_eq(write_file(path, H5P_DEFAULT, &l), 0);
    fmt_vfd_stats st;
    fmt_vfd_opts o = {.stats = &st};
    hid_t fapl = fmt_vfd_fapl(&o);
    check_file(path, fapl, &l);
    ck_assert_uint_gt(st.bytes_read_direct, 16 * MIB);
    H5Pclose(fapl);
    scratch_end(&sc);
}
END_TEST

/* Invariant 4: every kernel operation moves at most split_max bytes. */
START_TEST(split_large_writes)
{
    scratch sc = scratch_begin("split", "s.h5");
    const char *path = sc.path;
    static const size_t sizes[] = {MIB + 12, 200000};
    layout l = {sizes, 2, true};
    for (int m = 0; m < 2; m++) {
        fmt_vfd_stats st;
        fmt_vfd_opts o = {.mode = m ? FMT_IO_BUFFERED : FMT_IO_URING, .zero_copy = true, .split_max = 8192,
                          .stats = &st};
        hid_t fapl = fmt_vfd_fapl(&o);
        ck_assert_int_eq(write_file(path, fapl, &l), 0);
        ck_assert_uint_ge(st.writes, (MIB + 200000) / 8192);
        check_file(path, fapl, &l);
        check_file(path, H5P_DEFAULT, &l);
        H5Pclose(fapl);
    }
    scratch_end(&sc);
}
END_TEST

/* RK_IO=buffered is honoured: no O_DIRECT byte, plain pwrite + fdatasync. */
START_TEST(rk_io_buffered)
{
    scratch sc = scratch_begin("buf", "b.h5");
    const char *path = sc.path;
    setenv("RK_IO", "buffered", 1);
    fmt_vfd_stats st;
    fmt_vfd_opts o = {.stats = &st};
    hid_t fapl = fmt_vfd_fapl(&o);
    layout l = {odd_sizes, N_ODD, true};
    ck_assert_int_eq(write_file(path, fapl, &l), 0);
    ck_assert_str_eq(st.io_path, "buffered");
    ck_assert_uint_eq(st.bytes_direct, 0);
    ck_assert_uint_gt(st.bytes_buffered, 16 * MIB);
    check_file(path, H5P_DEFAULT, &l);
    H5Pclose(fapl);
    setenv("RK_IO", "fast", 1);
    ck_assert_int_lt(fmt_vfd_fapl(&o), 0);
    scratch_end(&sc);
}
END_TEST

/* Pages of the file at path resident in the page cache, and its pages in all. */
static size_t resident_pages(const char *path, size_t *pages)
{
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = ((size_t)sb.st_size + pg - 1) / pg, in = 0;
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    unsigned char *vec = malloc(n);
    ck_assert_int_eq(mincore(m, (size_t)sb.st_size, vec), 0);
    for (size_t i = 0; i < n; i++)
        in += vec[i] & 1;
    free(vec);
    munmap(m, (size_t)sb.st_size);
    close(fd);
    *pages = n;
    return in;
}

static const size_t lean_sizes[] = {16 * MIB + 12, 4097, 5 * MIB, 100000, 9 * MIB + 3};

/* Invariant 9: the buffered path starts the write-back every `writeback` bytes while it
   writes, and leaves none of the file's pages in the page cache after the close (a plain
   pwrite + fdatasync left all of them). */
START_TEST(buffered_path_starts_writeback_and_drops_pages)
{
    scratch sc = scratch_begin("lean", "l.h5");
    setenv("RK_IO", "buffered", 1);
    fmt_vfd_stats st;
    fmt_vfd_opts o = {.stats = &st, .zero_copy = true, .writeback = MIB};
    hid_t fapl = fmt_vfd_fapl(&o);
    layout l = {lean_sizes, (int)RK_ARRAY_LEN(lean_sizes), true};
    ck_assert_int_eq(write_file(sc.path, fapl, &l), 0);
    ck_assert_str_eq(st.io_path, "buffered");
    /* 30 MiB of tensors in pieces of at most 1 MiB: a write-back started at least every
       MiB written */
    ck_assert_uint_ge(st.writes, 30);
    ck_assert_uint_ge(st.writebacks, 25);
    struct statfs fs;
    ck_assert_int_eq(statfs(sc.dir, &fs), 0);
    if ((unsigned long)fs.f_type != 0x01021994UL) { /* on tmpfs the pages are the file */
        size_t pages, in = resident_pages(sc.path, &pages);
        ck_assert_msg(in * 100 < pages, "%zu of the file's %zu pages still in the page cache", in, pages);
    }
    check_file(sc.path, H5P_DEFAULT, &l);
    H5Pclose(fapl);
    scratch_end(&sc);
}
END_TEST

/* Invariants 9 and 5: a write that fails halfway through the buffered path, after
   write-backs were started, fails the file (sticky): a write-back started is no
   durability. RK_FAULT point: write (fio.h's pwrite), at the middle index. */
START_TEST(buffered_write_fault_after_writeback_fails)
{
    scratch sc = scratch_begin("leanf", "f.h5");
    setenv("RK_IO", "buffered", 1);
    fault_env(sc.path, NULL);
    fmt_vfd_stats st;
    fmt_vfd_opts o = {.stats = &st, .zero_copy = true, .writeback = MIB};
    hid_t fapl = fmt_vfd_fapl(&o);
    layout l = {lean_sizes, (int)RK_ARRAY_LEN(lean_sizes), true};
    ck_assert_int_eq(write_file(sc.path, fapl, &l), 0);
    uint64_t count = rk__fault_count(RK_FAULT_OP_WRITE), wb = st.writebacks;
    ck_assert_uint_gt(count, 20);
    char spec[64];
    snprintf(spec, sizeof spec, "write@%llu=eio", (unsigned long long)(count / 2));
    fault_env(sc.path, spec);
    th_capture c;
    th_capture_begin(&c);
    int rc = write_file(sc.path, fapl, &l);
    free(th_capture_end(&c));
    ck_assert_msg(rc < 0, "%s: the write succeeded", spec);
    ck_assert_int_eq(st.error, -EIO);
    ck_assert_uint_gt(st.writebacks, 0); /* the fault came after write-backs had started */
    ck_assert_uint_lt(st.writebacks, wb);
    H5Pclose(fapl);
    scratch_end(&sc);
}
END_TEST

/* Fallbacks are loud (one warning naming the reason) and recorded in io_path. */
static const struct {
    const char *dir, *fault, *io_path, *warn;
} fb_cfg[] = {
    {"/dev/shm", NULL, NULL, NULL}, /* tmpfs: O_DIRECT refused by older kernels, not by newer */
    {NULL, "odirect@*=einval", "uring+buffered", "O_DIRECT refused on"},
    {"/dev/shm", "odirect@*=einval", "uring+buffered", "O_DIRECT refused on tmpfs"},
    {NULL, "uring@*=eperm", "buffered", "io_uring unavailable"},
};

START_TEST(fallback_recorded_and_logged)
{
    scratch sc = scratch_begin("fb", "f.h5");
    if (fb_cfg[_i].dir) { /* the same file name in a new directory on tmpfs */
        th_rmrf(sc.dir);
        free(sc.dir);
        free(sc.path);
        sc.dir = strdup("/dev/shm/rk-test-vfd-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(sc.dir));
        sc.path = tmpfile_in(sc.dir, "f.h5");
    }
    const char *path = sc.path;
    if (fb_cfg[_i].fault)
        setenv("RK_FAULT", fb_cfg[_i].fault, 1);
    rk__fault_reset();
    fmt_vfd_stats st;
    fmt_vfd_opts o = {.stats = &st};
    hid_t fapl = fmt_vfd_fapl(&o);
    static const size_t sizes[] = {MIB + 12, 4097, 7};
    layout l = {sizes, 3, false};
    th_capture c;
    th_capture_begin(&c);
    int rc = write_file(path, fapl, &l);
    char *log = th_capture_end(&c);
    ck_assert_int_eq(rc, 0);
    const char *want = fb_cfg[_i].io_path;
    if (!want) /* whatever this kernel does on tmpfs, it is recorded and logged consistently */
        want = strcmp(st.io_path, "uring+odirect") == 0 ? "uring+odirect" : "uring+buffered";
    ck_assert_str_eq(st.io_path, want);
    const char *warn = fb_cfg[_i].warn ? fb_cfg[_i].warn : strcmp(want, "uring+odirect") ? "O_DIRECT refused" : NULL;
    if (warn) {
        ck_assert_msg(strstr(log, warn) && strstr(log, " WARN "), "log '%s' lacks a WARN '%s'", log, warn);
        ck_assert_msg(strchr(log, '\n') == strrchr(log, '\n'), "more than one line: '%s'", log);
        ck_assert_uint_eq(st.bytes_direct, 0);
    } else {
        ck_assert_str_eq(log, "");
    }
    free(log);
    check_file(path, fapl, &l);
    check_file(path, H5P_DEFAULT, &l);
    H5Pclose(fapl);
    /* RK_IO=uring demands io_uring: refused, the create fails. */
    if (fb_cfg[_i].fault && strstr(fb_cfg[_i].fault, "uring@")) {
        o.mode = FMT_IO_URING;
        fapl = fmt_vfd_fapl(&o);
        ck_assert_int_lt(write_file(path, fapl, &l), 0);
        H5Pclose(fapl);
    }
    scratch_end(&sc);
}
END_TEST

/* ---- faults ---------------------------------------------------------------------------------- */

static const size_t fault_sizes[] = {3 * MIB + 100, 4097, 70000, 10};

/* Writes the fault test file under RK_FAULT=spec; returns write_file's result. */
static int faulty_write(const char *path, const char *spec, int qd, bool zero_copy, fmt_vfd_stats *st)
{
    fault_env(path, spec);
    fmt_vfd_opts o = {.queue_depth = qd, .zero_copy = zero_copy, .piece = 256 << 10, .stats = st};
    hid_t fapl = fmt_vfd_fapl(&o);
    layout l = {fault_sizes, (int)RK_ARRAY_LEN(fault_sizes), true};
    th_capture c;
    th_capture_begin(&c);
    int rc = write_file(path, fapl, &l);
    free(th_capture_end(&c));
    H5Pclose(fapl);
    return rc;
}

static const struct {
    enum rk__fault_op op;
    const char *kind;
    int qd;
    bool zc;
} ft_cfg[] = {
    {RK_FAULT_OP_WRITE, "eio", 4, false}, {RK_FAULT_OP_WRITE, "enospc", 1, true}, {RK_FAULT_OP_WRITE, "short", 4, true},
    {RK_FAULT_OP_SYNC, "eio", 4, false},  {RK_FAULT_OP_TRUNCATE, "enospc", 4, false},
};

/* Invariant 5: an error at any index of the operation fails H5Dwrite or H5Fclose and is
   kept in stats->error; never a silent success. */
START_TEST(fault_at_every_index_fails)
{
    scratch sc = scratch_begin("fault", "f.h5");
    const char *path = sc.path;
    fmt_vfd_stats st;
    ck_assert_int_eq(faulty_write(path, NULL, ft_cfg[_i].qd, ft_cfg[_i].zc, &st), 0);
    uint64_t count = rk__fault_count(ft_cfg[_i].op);
    ck_assert_uint_gt(count, 0);
    fprintf(stderr, "%s: %llu operations\n", rk__fault_op_name(ft_cfg[_i].op), (unsigned long long)count);
    layout l = {fault_sizes, (int)RK_ARRAY_LEN(fault_sizes), true};
    check_file(path, H5P_DEFAULT, &l);
    for (uint64_t k = 0; k < count; k++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s@%llu=%s", rk__fault_op_name(ft_cfg[_i].op), (unsigned long long)k,
                 ft_cfg[_i].kind);
        int rc = faulty_write(path, spec, ft_cfg[_i].qd, ft_cfg[_i].zc, &st);
        ck_assert_msg(rc < 0, "%s: the write succeeded (of %llu ops)", spec, (unsigned long long)count);
        ck_assert_msg(st.error < 0, "%s: stats.error is %d", spec, st.error);
    }
    clear_env();
    scratch_end(&sc);
}
END_TEST

/* Without fmt_vfd_close, the error still fails a plain H5Fclose (in a child: HDF5 1.10
   keeps the id of a file whose close failed and would crash closing it again at exit). */
START_TEST(plain_h5fclose_fails)
{
    scratch sc = scratch_begin("plain", "p.h5");
    const char *path = sc.path;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("RK_LOG", "error", 1);
        rk__log_reload();
        fmt_vfd_opts o = {0};
        hid_t fapl = fmt_vfd_fapl(&o);
        hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        hsize_t dim = 100000;
        hid_t sp = H5Screate_simple(1, &dim, NULL);
        hid_t d = H5Dcreate2(f, "x", H5T_NATIVE_UINT8, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        void *buf = calloc(1, dim);
        if (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0 || H5Dclose(d) < 0)
            _exit(3);
        setenv("RK_FAULT", "sync@*=eio", 1);
        rk__fault_reset();
        herr_t rc = f >= 0 ? H5Fclose(f) : 0;
        _exit(f < 0 ? 2 : rc < 0 ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x (1: H5Fclose succeeded)",
                  status);
    scratch_end(&sc);
}
END_TEST

/* Invariant 7: after a failed H5Dwrite, a plain H5Fclose frees the file (no dangling id:
   the child exits through HDF5's atexit cleanup without crashing), and H5Fflush fails. */
START_TEST(plain_h5fclose_after_failed_write)
{
    scratch sc = scratch_begin("plain2", "p.h5");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("RK_LOG", "error", 1);
        rk__log_reload();
        fmt_vfd_stats st;
        fmt_vfd_opts o = {.stats = &st};
        hid_t fapl = fmt_vfd_fapl(&o);
        hid_t f = H5Fcreate(sc.path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        hsize_t dim = 3 * MIB;
        hid_t sp = H5Screate_simple(1, &dim, NULL);
        hid_t d = H5Dcreate2(f, "x", H5T_NATIVE_UINT8, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        void *buf = calloc(1, dim);
        setenv("RK_FAULT", "write@1=eio", 1);
        rk__fault_reset();
        int bad = 0;
        bad |= H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0;
        bad |= (H5Fflush(f, H5F_SCOPE_LOCAL) >= 0) << 1;
        bad |= (H5Dclose(d) < 0) << 2;
        bad |= (H5Fclose(f) < 0) << 3;
        bad |= (st.error != -EIO) << 4;
        H5Sclose(sp);
        H5Pclose(fapl);
        free(buf);
        exit(bad); /* runs HDF5's cleanup at exit */
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
    scratch_end(&sc);
}
END_TEST

/* A crash injected into the driver's write kills the writer (SIGKILL), in a child. */
START_TEST(crash_in_driver_write)
{
    scratch sc = scratch_begin("crashw", "c.h5");
    const char *path = sc.path;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        fmt_vfd_stats st;
        faulty_write(path, "write@3=crash", 4, false, &st);
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %#x, want SIGKILL", status);
    scratch_end(&sc);
}
END_TEST

/* ---- reading a checkpoint back (formats/fmt_read.c, fmt_readdirect.c) ------------------------ */

/* A checkpoint of 3 ranks written by the formats' own writer: sharded sh/f (f32 rows, all
   in one checksummed block) and sh/wide (rows of WIDE bytes, 3 to a block), rank 1 holding
   no rows of either; replicated `big` in shard 0, read with O_DIRECT in pieces of 4 MiB
   (more of them than the reader keeps in flight). */
#define NRANK 3
#define WIDE 300000
#define BIG (33 * MIB + 12)
static const int64_t f_rows[NRANK] = {16, 0, 16}, wide_rows[NRANK] = {5, 0, 4};

typedef struct {
    char *top, step[4200], io_path[FMT_IO_PATH_LEN];
    unsigned char *f, *wide, *big; /* the global tensors */
    fmt_manifest *m[NRANK];
} written;

static int64_t sum_rows(const int64_t *rows)
{
    return rows[0] + rows[1] + rows[2];
}

static fmt_tensor piece(const char *name, rk_dtype dt, int64_t row_bytes, const int64_t *rows, int r, uint32_t order,
                        const unsigned char *global)
{
    int64_t row0 = 0;
    for (int k = 0; k < r; k++)
        row0 += rows[k];
    fmt_tensor t = {.name = strdup(name), .dtype = dt, .ndim = 2, .shape = {rows[r], row_bytes / (int64_t)rk__dtype_size(dt)},
                    .nbytes = (uint64_t)(rows[r] * row_bytes), .order = order, .rank = r, .data = global + row0 * row_bytes,
                    .kind = FMT_SHARDED, .rows = sum_rows(rows), .row0 = row0};
    return t;
}

static void write_ckpt(written *w)
{
    clear_env();
    memset(w, 0, sizeof(*w));
    w->top = th_tmpdir("rd");
    snprintf(w->step, sizeof(w->step), "%s/step-000000000006", w->top);
    ck_assert_int_eq(mkdir(w->step, 0755), 0);
    ck_assert_ptr_nonnull(w->f = malloc((size_t)sum_rows(f_rows) * 4));
    ck_assert_ptr_nonnull(w->wide = malloc((size_t)sum_rows(wide_rows) * WIDE));
    ck_assert_ptr_nonnull(w->big = malloc(BIG));
    th_pattern(w->f, (size_t)sum_rows(f_rows) * 4, 1);
    th_pattern(w->wide, (size_t)sum_rows(wide_rows) * WIDE, 2);
    th_pattern(w->big, BIG, 3);
    for (int r = 0; r < NRANK; r++) {
        fmt_manifest *m = calloc(1, sizeof(*m));
        ck_assert_ptr_nonnull(m);
        *m = (fmt_manifest){.version = FMT_VERSION, .step = 6, .rank = r, .world = NRANK, .nonce = 42, .n = r ? 2 : 3};
        ck_assert_ptr_nonnull(m->t = calloc(m->n, sizeof(*m->t)));
        m->t[0] = piece("sh/f", RK_F32, 4, f_rows, r, 0, w->f);
        m->t[1] = piece("sh/wide", RK_U8, WIDE, wide_rows, r, 1, w->wide);
        if (r == 0)
            m->t[2] = (fmt_tensor){.name = strdup("big"), .dtype = RK_U8, .ndim = 1, .shape = {BIG}, .nbytes = BIG,
                                   .order = 2, .data = w->big};
        char path[4300];
        fmt_write_stats st;
        snprintf(path, sizeof(path), "%s/shard-%d.h5", w->step, r);
        ck_assert_msg(fmt_shard_write(path, m, "auto", &st) == 0, "%s", rk_last_error());
        snprintf(m->io_path, sizeof(m->io_path), "%s", st.io_path);
        snprintf(w->io_path, sizeof(w->io_path), "%s", st.io_path);
        snprintf(path, sizeof(path), "%s/shard-%d.ok", w->step, r);
        ck_assert_int_eq(fmt_manifest_write(path, m), 0);
        w->m[r] = m;
    }
    ck_assert_msg(fmt_index_write(w->step, 6, NRANK, w->m, w->io_path, 1) == 0, "%s", rk_last_error());
}

/* Rank r's manifest written again from w->m[r] (a crafted one), the commit record with it. */
static void rewrite_manifest(written *w, int r)
{
    char path[4300];
    snprintf(path, sizeof(path), "%s/shard-%d.ok", w->step, r);
    ck_assert_int_eq(fmt_manifest_write(path, w->m[r]), 0);
    ck_assert_int_eq(fmt_commit_write(w->step, 6, NRANK, w->m, w->io_path, 1), 0);
}

static void written_free(written *w)
{
    for (int r = 0; r < NRANK; r++)
        fmt_manifest_free(&w->m[r]);
    free(w->f);
    free(w->wide);
    free(w->big);
    th_rmrf(w->top);
    free(w->top);
    clear_env();
}

/* Every row range of both sharded tensors (blocks read whole or in part, across pieces and
   the empty one) and the large replicated tensor, bitwise. */
START_TEST(sharded_rows_read_back)
{
    written w;
    write_ckpt(&w);
    ck_assert_uint_eq(w.m[0]->t[1].block_rows, MIB / WIDE);
    fmt_ckpt *c = NULL;
    ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
    const struct {
        const char *name;
        int64_t rows, rb;
        const unsigned char *want;
    } ts[] = {{"sh/f", sum_rows(f_rows), 4, w.f}, {"sh/wide", sum_rows(wide_rows), WIDE, w.wide}};
    unsigned char *buf = malloc(BIG);
    ck_assert_ptr_nonnull(buf);
    for (size_t k = 0; k < RK_ARRAY_LEN(ts); k++) {
        long i = fmt_ckpt_find(c, ts[k].name);
        ck_assert_int_ge(i, 0);
        for (int64_t first = 0; first <= ts[k].rows; first++)
            for (int64_t n = 0; first + n <= ts[k].rows; n++) {
                th_assert_rc(fmt_ckpt_read_rows(c, (size_t)i, first, n, buf), 0);
                ck_assert_msg(memcmp(buf, ts[k].want + first * ts[k].rb, (size_t)(n * ts[k].rb)) == 0,
                              "%s rows %ld+%ld differ", ts[k].name, (long)first, (long)n);
            }
    }
    long i = fmt_ckpt_find(c, "big");
    ck_assert_int_ge(i, 0);
    th_assert_rc(fmt_ckpt_read(c, (size_t)i, buf), 0);
    ck_assert(memcmp(buf, w.big, BIG) == 0);
    free(buf);
    fmt_ckpt_close(&c);
    written_free(&w);
}
END_TEST

/* A manifest whose block size is not the writer's is refused, naming it, with its checksums
   (the block's and the file's, which are plain XXH3) right: 2^62 rows of 4 bytes (the buffer
   of a block, 2^64 bytes, wrapped to 0), and one piece's blocks smaller than the other's
   (the buffer sized for the first piece's). Before: both opened, and a read of those rows
   wrote past the buffer. */
static const struct {
    int rank;
    uint64_t block_rows;
    int64_t first, nrows; /* the read that overflowed */
} crafted[] = {{2, 1ull << 62, 17, 2}, {0, 2, 1, 30}};

START_TEST(block_size_not_the_writers_refused)
{
    written w;
    write_ckpt(&w);
    fmt_tensor *t = &w.m[crafted[_i].rank]->t[0]; /* its piece of sh/f: 16 rows of 4 bytes */
    ck_assert_uint_eq(t->block_rows, MIB / 4);
    ck_assert_uint_eq(t->nblocks, 1);
    t->block_rows = crafted[_i].block_rows;
    t->nblocks = (16 + t->block_rows - 1) / t->block_rows;
    ck_assert_ptr_nonnull(t->blocks = realloc(t->blocks, t->nblocks * sizeof(*t->blocks)));
    for (uint64_t b = 0; b < t->nblocks; b++)
        t->blocks[b] = fmt_xxh3(w.f + t->row0 * 4 + b * t->block_rows * 4, t->nblocks > 1 ? t->block_rows * 4 : 64);
    rewrite_manifest(&w, crafted[_i].rank);
    fmt_ckpt *c = NULL;
    int rc = fmt_ckpt_open(w.step, &c);
    if (rc == 0) {
        float buf[32];
        fmt_ckpt_read_rows(c, (size_t)fmt_ckpt_find(c, "sh/f"), crafted[_i].first, crafted[_i].nrows, buf);
        fmt_ckpt_close(&c);
    }
    th_assert_rc(rc, RK_E_CORRUPT);
    char want[32];
    snprintf(want, sizeof(want), "shard-%d.ok", crafted[_i].rank);
    ck_assert_msg(strstr(rk_last_error(), want), "'%s' does not name %s", rk_last_error(), want);
    written_free(&w);
}
END_TEST

/* A submission of the O_DIRECT reader that io_uring refuses: the first (nothing in flight)
   ends the ring, and this read and the next take pread, with one warning; a later one
   (reads in flight) is tried again with the next. Never a wait for reads that were never
   submitted. Before: the reader waited 60 s for them, then failed with RK_E_TIMEOUT. */
static const struct {
    const char *fault; /* uring@0 is the ring's setup */
    bool fallback;
} refused[] = {{"uring@1=eio", true}, {"uring@2=eperm", false}};

START_TEST(refused_submission_waits_for_none)
{
    written w;
    write_ckpt(&w);
    setenv("RK_FAULT", refused[_i].fault, 1);
    ck_assert_int_eq(rk__fault_reset(), 0);
    fmt_ckpt *c = NULL;
    ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
    long i = fmt_ckpt_find(c, "big");
    ck_assert_int_ge(i, 0);
    unsigned char *buf = malloc(BIG);
    ck_assert_ptr_nonnull(buf);
    th_capture cap;
    th_capture_begin(&cap);
    int64_t t0 = rk__mono_ns();
    int rc = fmt_ckpt_read(c, (size_t)i, buf);
    double ms = rk__ms_since(t0);
    uint64_t submits = rk__fault_count(RK_FAULT_OP_URING);
    char *log = th_capture_end(&cap);
    th_assert_rc(rc, 0);
    ck_assert_msg(ms < 10000, "the read took %.0f ms", ms);
    ck_assert(memcmp(buf, w.big, BIG) == 0);
    ck_assert_uint_ge(submits, refused[_i].fallback ? 2 : 3); /* the fault was reached */
    ck_assert_msg(!refused[_i].fallback == !strstr(log, "io_uring refused the reads"), "log: '%s'", log);
    free(log);
    memset(buf, 0, BIG);
    th_assert_rc(fmt_ckpt_read(c, (size_t)i, buf), 0);
    ck_assert(memcmp(buf, w.big, BIG) == 0);
    if (refused[_i].fallback)
        ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_URING), submits); /* the ring is gone */
    free(buf);
    fmt_ckpt_close(&c);
    written_free(&w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("vfd");
    TCase *tc = tcase_create("fio");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, fio_wrappers_and_counts);
    tcase_add_loop_test(tc, fio_bad_spec_ignored_with_log, 0, (int)RK_ARRAY_LEN(bad_specs));
    tcase_add_test(tc, fio_crash_before_rename);
    suite_add_tcase(s, tc);

    tc = tcase_create("roundtrip");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, roundtrip_odd_sizes, 0, (int)RK_ARRAY_LEN(rt_cfg));
    tcase_add_test(tc, reads_sec2_files);
    tcase_add_test(tc, split_large_writes);
    tcase_add_test(tc, rk_io_buffered);
    tcase_add_test(tc, buffered_path_starts_writeback_and_drops_pages);
    tcase_add_test(tc, buffered_write_fault_after_writeback_fails);
    tcase_add_loop_test(tc, fallback_recorded_and_logged, 0, (int)RK_ARRAY_LEN(fb_cfg));
    suite_add_tcase(s, tc);

    tc = tcase_create("faults");
    tcase_set_timeout(tc, 90);
    tcase_add_loop_test(tc, fault_at_every_index_fails, 0, (int)RK_ARRAY_LEN(ft_cfg));
    tcase_add_test(tc, crash_in_driver_write);
    tcase_add_test(tc, plain_h5fclose_fails);
    tcase_add_test(tc, plain_h5fclose_after_failed_write);
    suite_add_tcase(s, tc);

    tc = tcase_create("read");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, sharded_rows_read_back);
    tcase_add_loop_test(tc, block_size_not_the_writers_refused, 0, (int)RK_ARRAY_LEN(crafted));
    tcase_add_loop_test(tc, refused_submission_waits_for_none, 0, (int)RK_ARRAY_LEN(refused));
    suite_add_tcase(s, tc);
    return th_main(s);
}
