/*
 * bench/raw_uring.h - the raw transfer the benchmarks of the disk measure against: len
 * bytes between buf and fd in operations of `piece` bytes, qd of them in flight through
 * io_uring (as fio's io_uring engine). Exits with status 2 on any failure or short
 * transfer (a benchmark, not the library). Included by bench_io.c and bench_disk.c.
 */
#ifndef RK_BENCH_RAW_URING_H
#define RK_BENCH_RAW_URING_H

#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void raw_xfer(int fd, bool rd, char *buf, size_t len, unsigned qd, size_t piece)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(qd, &ring, 0);
    if (rc < 0) {
        fprintf(stderr, "raw_xfer: io_uring_queue_init: %s\n", strerror(-rc));
        exit(2);
    }
    size_t pos = 0;
    unsigned inflight = 0;
    while (pos < len || inflight > 0) {
        while (pos < len && inflight < qd) {
            size_t n = len - pos < piece ? len - pos : piece;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (rd)
                io_uring_prep_read(sqe, fd, buf + pos, (unsigned)n, (off_t)pos);
            else
                io_uring_prep_write(sqe, fd, buf + pos, (unsigned)n, (off_t)pos);
            sqe->user_data = n;
            pos += n;
            inflight++;
        }
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if ((rc = io_uring_wait_cqe(&ring, &cqe)) < 0 || cqe->res < 0 ||
            (uint64_t)cqe->res != cqe->user_data) {
            fprintf(stderr, "raw_xfer: %s failed or was short: %s\n", rd ? "read" : "write",
                    strerror(rc < 0         ? -rc
                             : cqe->res < 0 ? -cqe->res
                                            : EIO));
            exit(2);
        }
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
    }
    io_uring_queue_exit(&ring);
}

#endif
