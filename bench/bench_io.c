/*
 * bench/bench_io.c - the checkpoint I/O path against its physical limit and its peers.
 *
 *   bench_io [--dir D] [--gib G] [--datasets N] [--rounds R] [--python PY --peer SCRIPT]
 *
 * Writes G GiB spread over N float32 datasets, each method ending durable (fdatasync), in
 * interleaved rounds (the order rotates each round), to fresh files in D:
 *   raw        O_DIRECT + io_uring write of the same bytes (best of two depth/piece pairs):
 *              the physical limit, measured in the same round
 *   drv-zc     the HDF5 driver (formats/vfd_uring.c), zero copy
 *   drv-staged the driver copying through its staging buffers
 *   sec2       HDF5's default driver, then fdatasync
 *   h5py       h5py (SCRIPT run by PY), then os.fsync
 * and reads back (restore): raw O_DIRECT read vs the driver's H5Dread of every dataset,
 * after dropping the page cache when the kernel lets us (said in the output).
 * Prints per method the median GB/s and the median of its per-round ratio to raw.
 */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../formats/vfd_uring.h"
#include "raw_uring.h"

#define PAGE 4096
#define MAXR 16

enum { M_RAW, M_ZC, M_STAGED, M_SEC2, M_H5PY, M_RRAW, M_RDRV, M_COUNT };
static const char *const mname[M_COUNT] = {"raw O_DIRECT write", "driver, zero copy", "driver, staged",
                                           "HDF5 sec2 + fsync", "h5py + fsync", "raw O_DIRECT read",
                                           "driver read (H5Dread)"};

typedef struct {
    const char *dir, *python, *peer;
    double gib;
    int ndsets, rounds;
    size_t total;
    size_t *size, *off; /* per dataset, bytes; offsets page-aligned in buf */
    char *buf;          /* the tensors (page-aligned) */
    size_t span;        /* bytes of buf */
} bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_io: %s\n", what);
    exit(2);
}

static void path_of(const bench *b, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", b->dir, name);
}

/* ---- raw O_DIRECT through io_uring --------------------------------------------------------- */

static double raw_write(const bench *b, unsigned qd, size_t piece)
{
    char p[4096];
    path_of(b, "raw.bin", p, sizeof p);
    unlink(p);
    double t0 = now_s();
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)b->span) != 0)
        die("raw: open/ftruncate (O_DIRECT refused here?)");
    raw_xfer(fd, false, b->buf, b->span, qd, piece);
    if (fdatasync(fd) != 0)
        die("raw: fdatasync");
    close(fd);
    return now_s() - t0;
}

static double raw_read(const bench *b, char *dst)
{
    char p[4096];
    path_of(b, "raw.bin", p, sizeof p);
    double t0 = now_s();
    int fd = open(p, O_RDONLY | O_DIRECT);
    if (fd < 0)
        die("raw read: open");
    raw_xfer(fd, true, dst, b->span, 16, (size_t)1 << 20);
    close(fd);
    return now_s() - t0;
}

/* ---- HDF5 --------------------------------------------------------------------------------- */

static double h5_write(const bench *b, hid_t fapl, const char *name, bool fsync_after, bool via_vfd_close)
{
    char p[4096];
    path_of(b, name, p, sizeof p);
    unlink(p);
    double t0 = now_s();
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    if (f < 0)
        die("H5Fcreate");
    for (int k = 0; k < b->ndsets; k++) {
        char dn[32];
        snprintf(dn, sizeof dn, "t%03d", k);
        hsize_t dim = b->size[k] / 4;
        hid_t sp = H5Screate_simple(1, &dim, NULL);
        hid_t d = H5Dcreate2(f, dn, H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        if (d < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, b->buf + b->off[k]) < 0)
            die("H5Dcreate/H5Dwrite");
        H5Dclose(d);
        H5Sclose(sp);
    }
    H5Pclose(dcpl);
    if (via_vfd_close ? fmt_vfd_close(&f) != 0 : H5Fclose(f) < 0)
        die("close");
    if (fsync_after) {
        int fd = open(p, O_RDONLY);
        if (fd < 0 || fdatasync(fd) != 0)
            die("fdatasync after sec2");
        close(fd);
    }
    return now_s() - t0;
}

static double h5_read(const bench *b, hid_t fapl, const char *name, char *dst)
{
    char p[4096];
    path_of(b, name, p, sizeof p);
    double t0 = now_s();
    hid_t f = H5Fopen(p, H5F_ACC_RDONLY, fapl);
    if (f < 0)
        die("H5Fopen for reading");
    for (int k = 0; k < b->ndsets; k++) {
        char dn[32];
        snprintf(dn, sizeof dn, "t%03d", k);
        hid_t d = H5Dopen2(f, dn, H5P_DEFAULT);
        if (d < 0 || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst + b->off[k]) < 0)
            die("H5Dread");
        H5Dclose(d);
    }
    H5Fclose(f);
    return now_s() - t0;
}

static double h5py_write(const bench *b)
{
    char p[4096], cmd[16384];
    path_of(b, "h5py.h5", p, sizeof p);
    unlink(p);
    char sizes[4096];
    path_of(b, "sizes.txt", sizes, sizeof sizes);
    FILE *sf = fopen(sizes, "w");
    if (!sf)
        die("sizes.txt");
    for (int k = 0; k < b->ndsets; k++)
        fprintf(sf, "%zu\n", b->size[k]);
    fclose(sf);
    snprintf(cmd, sizeof cmd, "%s %s write %s %s", b->python, b->peer, p, sizes);
    FILE *pp = popen(cmd, "r");
    double secs = -1;
    if (!pp || fscanf(pp, "%lf", &secs) != 1)
        secs = -1;
    if (pp && pclose(pp) != 0)
        secs = -1;
    return secs;
}

static bool drop_caches(void)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd < 0)
        return false;
    bool ok = write(fd, "3\n", 2) == 2;
    close(fd);
    return ok;
}

/* ---- layout and statistics ------------------------------------------------------------------ */

/* N float32 datasets of uneven, odd sizes summing to about total bytes. */
static void layout(bench *b)
{
    b->size = calloc((size_t)b->ndsets, sizeof *b->size);
    b->off = calloc((size_t)b->ndsets, sizeof *b->off);
    double wsum = 0, *w = calloc((size_t)b->ndsets, sizeof *w);
    for (int k = 0; k < b->ndsets; k++)
        wsum += (w[k] = 1.0 + (double)((k * 37) % 100) + (k % 9 == 0 ? 300.0 : 0.0));
    size_t off = 0, sum = 0;
    for (int k = 0; k < b->ndsets; k++) {
        size_t n = (size_t)(b->total * (w[k] / wsum)) / 4 * 4 + 4 * (size_t)(k % 3); /* odd element counts */
        b->size[k] = n ? n : 4;
        b->off[k] = off;
        off += (b->size[k] + PAGE - 1) / PAGE * PAGE;
        sum += b->size[k];
    }
    b->total = sum;
    b->span = off;
    free(w);
    void *p = NULL;
    if (posix_memalign(&p, PAGE, b->span) != 0)
        die("out of memory for the tensors");
    b->buf = p;
    uint32_t x = 12345;
    float *fp = (float *)b->buf;
    for (size_t i = 0; i < b->span / 4; i++) { /* touch every page: the memory is resident */
        x = x * 1664525u + 1013904223u;
        fp[i] = (float)(x >> 8) * 1e-3f;
    }
}

static int cmp_d(const void *a, const void *c)
{
    double x = *(const double *)a, y = *(const double *)c;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    double t[MAXR];
    memcpy(t, v, sizeof(double) * (size_t)n);
    qsort(t, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    bench b = {.dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", .gib = 1, .ndsets = 71, .rounds = 3,
               .python = "/usr/bin/python3", .peer = NULL};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) b.dir = argv[i + 1];
        else if (!strcmp(argv[i], "--gib")) b.gib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--datasets")) b.ndsets = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) b.rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--python")) b.python = argv[i + 1];
        else if (!strcmp(argv[i], "--peer")) b.peer = argv[i + 1];
        else die("usage: bench_io [--dir D] [--gib G] [--datasets N] [--rounds R] [--python PY --peer SCRIPT]");
    }
    if (b.rounds < 1 || b.rounds > MAXR || b.ndsets < 1 || b.gib <= 0)
        die("bad --rounds (1..16), --datasets or --gib");
    b.total = (size_t)(b.gib * (1 << 30));
    layout(&b);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    fmt_vfd_stats st_zc, st_staged;
    /* The driver's defaults, unless RK_BENCH_QD / RK_BENCH_PIECE_KIB say otherwise. */
    int qd = getenv("RK_BENCH_QD") ? atoi(getenv("RK_BENCH_QD")) : 0;
    size_t piece = getenv("RK_BENCH_PIECE_KIB") ? (size_t)atoi(getenv("RK_BENCH_PIECE_KIB")) << 10 : 0;
    fmt_vfd_opts ozc = {.mode = FMT_IO_URING, .zero_copy = true, .queue_depth = qd, .piece = piece, .stats = &st_zc};
    fmt_vfd_opts ost = {.mode = FMT_IO_URING, .queue_depth = qd, .piece = piece, .stats = &st_staged};
    hid_t fzc = fmt_vfd_fapl(&ozc), fst = fmt_vfd_fapl(&ost);
    if (fzc < 0 || fst < 0)
        die("fmt_vfd_fapl");
    char *rbuf = NULL;
    if (posix_memalign((void **)&rbuf, PAGE, b.span) != 0)
        die("out of memory for the read buffer");
    memset(rbuf, 0, b.span);

    double t[M_COUNT][MAXR], ratio[M_COUNT][MAXR];
    int best_qd[MAXR];
    double memcpy_gbs[MAXR];
    bool dropped = true;
    printf("bench_io: %.2f GB in %d float32 datasets, %d rounds, files in %s\n", b.total / 1e9, b.ndsets,
           b.rounds, b.dir);
    for (int r = 0; r < b.rounds; r++) {
        for (int j = 0; j < 5; j++) {
            int m = (j + r) % 5; /* rotate the order each round */
            switch (m) {
            case M_RAW: {
                double a = raw_write(&b, 16, (size_t)1 << 20), c = raw_write(&b, 32, (size_t)4 << 20);
                t[M_RAW][r] = a < c ? a : c;
                best_qd[r] = a < c ? 16 : 32;
                break;
            }
            case M_ZC: t[M_ZC][r] = h5_write(&b, fzc, "zc.h5", false, true); break;
            case M_STAGED: t[M_STAGED][r] = h5_write(&b, fst, "staged.h5", false, true); break;
            case M_SEC2: t[M_SEC2][r] = h5_write(&b, H5P_DEFAULT, "sec2.h5", true, false); break;
            case M_H5PY: t[M_H5PY][r] = b.peer ? h5py_write(&b) : -1; break;
            }
        }
        if (strcmp(st_zc.io_path, "uring+odirect") || st_zc.error || st_staged.error)
            fprintf(stderr, "bench_io: warning: driver io_path %s, errors %d/%d\n", st_zc.io_path, st_zc.error,
                    st_staged.error);
        double c0 = now_s(); /* the staged path's other limit: one thread's memcpy, same bytes */
        memcpy(rbuf, b.buf, b.span);
        memcpy_gbs[r] = b.span / (now_s() - c0) / 1e9;
        dropped &= drop_caches();
        t[M_RRAW][r] = raw_read(&b, rbuf);
        dropped &= drop_caches();
        memset(rbuf, 0, b.span);
        t[M_RDRV][r] = h5_read(&b, fst, "zc.h5", rbuf);
        for (int k = 0; k < b.ndsets; k++)
            if (memcmp(rbuf + b.off[k], b.buf + b.off[k], b.size[k]) != 0)
                die("driver read back different bytes");
        for (int m = 0; m < M_COUNT; m++) { /* throughput over the limit's throughput */
            double limit = b.span / (m >= M_RRAW ? t[M_RRAW][r] : t[M_RAW][r]);
            double bytes = m == M_RAW || m == M_RRAW ? b.span : b.total;
            ratio[m][r] = t[m][r] > 0 ? bytes / t[m][r] / limit : 0;
        }
        fprintf(stderr, "round %d: raw %.2f GB/s (qd %d), zc %.2f, staged %.2f, sec2 %.2f, h5py %.2f; read raw %.2f, "
                        "driver %.2f\n", r, b.total / t[M_RAW][r] / 1e9, best_qd[r], b.total / t[M_ZC][r] / 1e9,
                b.total / t[M_STAGED][r] / 1e9, b.total / t[M_SEC2][r] / 1e9,
                t[M_H5PY][r] > 0 ? b.total / t[M_H5PY][r] / 1e9 : 0, b.span / t[M_RRAW][r] / 1e9,
                b.total / t[M_RDRV][r] / 1e9);
    }
    printf("| method | GB/s (median) | ratio to raw (median of rounds) |\n|---|---|---|\n");
    for (int m = 0; m < M_COUNT; m++) {
        if (m == M_H5PY && !b.peer)
            continue;
        double gbs[MAXR];
        for (int r = 0; r < b.rounds; r++)
            gbs[r] = t[m][r] > 0 ? (m == M_RRAW || m == M_RAW ? b.span : b.total) / t[m][r] / 1e9 : 0;
        printf("| %s | %.2f | %.2f |\n", mname[m], median(gbs, b.rounds), median(ratio[m], b.rounds));
    }
    printf("memcpy of the same bytes into a reused buffer (one thread): %.2f GB/s\n", median(memcpy_gbs, b.rounds));
    printf("page cache before reads: %s\n", dropped ? "dropped (echo 3 > /proc/sys/vm/drop_caches)"
                                                    : "NOT dropped (refused here); both reads are O_DIRECT");
    const char *names[] = {"raw.bin", "zc.h5", "staged.h5", "sec2.h5", "h5py.h5", "sizes.txt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[4096];
        path_of(&b, names[i], p, sizeof p);
        unlink(p);
    }
    H5Pclose(fzc);
    H5Pclose(fst);
    free(rbuf);
    free(b.buf);
    free(b.size);
    free(b.off);
    return 0;
}
