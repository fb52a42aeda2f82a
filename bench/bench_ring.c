/*
 * bench/bench_ring.c - bus bandwidth of the ring's allreduce against MPI_Allreduce, in
 * the same job, alternating call by call on the same buffer size (f32 sum, in place).
 * Run under mpirun -n N. Prints, per size, the median time of each and the bus bandwidth
 * 2(N-1)/N * bytes / time (the bandwidth each link carries in a ring), and the ratio.
 * Also the cost of the argument check (the signature in every message's tag): none in
 * messages or bytes; measured as a count-0 call, which is all protocol overhead.
 *   bench_ring [MAX_BYTES [CHUNK_BYTES WINDOW]]   (default 256 MiB; the ring's chunking)
 * BENCH_RING_THREADS=multiple initializes MPI with MPI_THREAD_MULTIPLE instead of
 * MPI_THREAD_SERIALIZED (what Rekindle asks for): the cost of the locks that level takes.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ring/ring.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int provided, rank, n;
    const char *th = getenv("BENCH_RING_THREADS");
    bool multiple = th && strcmp(th, "multiple") == 0;
    MPI_Init_thread(&argc, &argv, multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, &provided);
    if (multiple && provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "bench_ring: MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t maxb = argc > 1 ? strtoull(argv[1], NULL, 0) : (256u << 20);
    ring *r = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 600000) != 0) {
        fprintf(stderr, "ring_create: %s\n", rk_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (argc > 3 && ring_set_chunking(r, strtoull(argv[2], NULL, 0), atoi(argv[3])) != 0) {
        fprintf(stderr, "ring_set_chunking: %s\n", rk_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    float *buf = malloc(maxb);
    for (size_t i = 0; i < maxb / 4; i++)
        buf[i] = (float)((i + (size_t)rank) % 13) * 0.25f;
    if (rank == 0)
        printf("ranks %d  %10s %11s %11s %10s %10s %7s\n", n, "bytes", "ring_us", "mpi_us", "ring_GB/s",
               "mpi_GB/s", "ratio");
    for (size_t b = 4096; b <= maxb; b *= 4) {
        size_t cnt = b / 4;
        int iters = b <= (1u << 20) ? 200 : b <= (16u << 20) ? 20 : 5;
        double *tr = malloc(sizeof(double) * (size_t)iters), *tm = malloc(sizeof(double) * (size_t)iters);
        for (int w = 0; w < 2; w++) { /* warm-up */
            ring_allreduce(r, buf, cnt, RK_F32, RK_SUM, NULL);
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        for (int i = 0; i < iters; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            int rc = ring_allreduce(r, buf, cnt, RK_F32, RK_SUM, NULL);
            double t1 = MPI_Wtime();
            if (rc != 0) {
                fprintf(stderr, "ring_allreduce: %s\n", rk_strerror(rc));
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            MPI_Barrier(MPI_COMM_WORLD);
            double t2 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t3 = MPI_Wtime();
            tr[i] = t1 - t0;
            tm[i] = t3 - t2;
        }
        /* The slowest rank's time is the collective's time: max over ranks, per call. */
        MPI_Allreduce(MPI_IN_PLACE, tr, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, tm, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        qsort(tr, (size_t)iters, sizeof(double), cmp_d);
        qsort(tm, (size_t)iters, sizeof(double), cmp_d);
        double r_med = tr[iters / 2], m_med = tm[iters / 2], f = 2.0 * (n - 1) / n * (double)b / 1e9;
        if (rank == 0)
            printf("ranks %d  %10zu %11.1f %11.1f %10.3f %10.3f %7.2f\n", n, b, r_med * 1e6, m_med * 1e6,
                   f / r_med, f / m_med, m_med / r_med);
        free(tr);
        free(tm);
    }
    /* Latency of an empty call: the protocol alone (2(N-1) zero-byte messages). */
    double t0 = MPI_Wtime();
    for (int i = 0; i < 1000; i++)
        ring_allreduce(r, buf, 0, RK_F32, RK_SUM, NULL);
    double t1 = MPI_Wtime();
    for (int i = 0; i < 1000; i++)
        MPI_Allreduce(MPI_IN_PLACE, buf, 0, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t2 = MPI_Wtime();
    if (rank == 0)
        printf("ranks %d  count-0 call: ring %.1f us, MPI %.1f us\n", n, (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    ring_destroy(&r);
    free(buf);
    MPI_Finalize();
    return 0;
}
