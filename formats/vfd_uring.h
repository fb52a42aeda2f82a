/*
 * formats/vfd_uring.h - an HDF5 1.10 virtual file driver that writes raw data with
 * O_DIRECT through io_uring, many writes in flight, and reads it back the same way.
 * Private to formats/ (only the .c files of formats/ include it).
 *
 * What the driver does with a file (see vfd_uring.c for the details):
 *  - No O_DIRECT write extends the file: given its expected size (opts.prealloc), the file
 *    is allocated whole (fallocate) before its first raw-data write; otherwise, or past
 *    that size, it is sized (ftruncate) up to the end of allocation before raw data is
 *    written past its end. HDF5 truncates it to the end of allocation at flush and close.
 *  - The fapl it returns aligns every object of 4 KiB or more on a 4 KiB boundary
 *    (H5Pset_alignment) and keeps metadata in 1 MiB blocks away from raw data
 *    (H5Pset_meta_block_size), so a raw-data write has a page-aligned interior.
 *  - The aligned interior of a raw-data write goes to the kernel with O_DIRECT in pieces
 *    of `piece` bytes, up to `queue_depth` in flight, from page-aligned staging buffers
 *    (a bounded pool, reused) or, with zero_copy, straight from the caller's memory.
 *    Unaligned heads and tails, small raw data and metadata are written synchronously
 *    through an ordinary descriptor; no 4 KiB page is ever written both ways.
 *  - Metadata is gathered by HDF5 (metadata cache and accumulator) and reaches the driver
 *    mostly during H5Fclose.
 *  - In-flight writes are drained before every read, truncate, flush and close; flush and
 *    close end with fdatasync (through io_uring): a file whose H5Fclose returned >= 0 is
 *    durable (its name still needs the directory fsync after a rename).
 *  - The buffered path (RK_IO=buffered, or io_uring refused) writes as dd would, leaner:
 *    large pwrites, the write-back started every 32 MiB (sync_file_range), one fdatasync,
 *    then the file's pages dropped from the page cache (POSIX_FADV_DONTNEED).
 *  - Any I/O error, real or injected (fio.h), is sticky: it is kept in stats->error and
 *    makes the current or next H5Dwrite / H5Fflush / H5Fclose / fmt_vfd_close fail (close
 *    with fmt_vfd_close: see there why).
 *  - The files are ordinary HDF5 files: the default (sec2) driver, h5dump and h5py read
 *    them, and this driver reads files written by any driver.
 *
 * Advice for callers:
 *  - Create datasets with H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) (and early
 *    allocation if wanted): otherwise HDF5 writes each dataset twice, fill then data.
 *  - zero_copy is only safe when H5Dwrite needs no type conversion (memory type equal to
 *    the file type), the layout is contiguous, and the buffers stay untouched until
 *    H5Fclose (or H5Fflush) returns: a conversion buffer is HDF5's and is reused.
 */
#ifndef RK_FMT_VFD_URING_H
#define RK_FMT_VFD_URING_H

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum fmt_io_mode { FMT_IO_AUTO, FMT_IO_URING, FMT_IO_BUFFERED }; /* RK_IO=auto|uring|buffered */

/* "auto", "uring", "buffered" -> *mode; RK_E_OPTION otherwise (NULL or "" is auto). */
int fmt_io_mode_parse(const char *s, enum fmt_io_mode *mode);

/* RK_IO=auto (fio_probe.c): the choice for the device of directory dir, measured there at
   its first use (each way written through this driver) and kept per device, or read from
   where it was kept. Never fails: where nothing can be measured it chooses uring, with a
   warning. *p says what the choice rests on. */
typedef struct fmt_io_probe {
    enum fmt_io_mode mode;         /* FMT_IO_URING (open the file FMT_IO_AUTO) or FMT_IO_BUFFERED */
    double direct_gbs, buffered_gbs; /* each way's best round (0: not measured) */
    char direct_path[48];          /* the driver's io_path of the direct way ("uring+odirect") */
    bool measured;                 /* measured in this call */
    bool first;                    /* the first choice for this device in this process */
    double age_s;                  /* of a measurement read from the cache */
    char cache[512];               /* the cache file it is kept in, "" if not kept */
    char why[160];                 /* "" or "; " and why it is not kept or not measured */
} fmt_io_probe;
int fmt_io_auto(const char *dir, fmt_io_probe *p);

typedef struct fmt_vfd_stats {
    char io_path[48];        /* set at open: "uring+odirect", "uring+buffered", "buffered" */
    uint64_t bytes_direct;   /* bytes written with O_DIRECT */
    uint64_t bytes_buffered; /* bytes written through the page cache */
    uint64_t writes;         /* write operations handed to the kernel (each <= split_max) */
    uint64_t max_inflight;   /* most writes in flight at once */
    uint64_t bytes_zero_copy; /* of bytes_direct, written straight from the caller's memory */
    uint64_t bytes_read_direct, bytes_read_buffered;
    uint64_t writebacks;     /* buffered path: write-backs started while writing (sync_file_range) */
    uint64_t prealloc;       /* bytes allocated (fallocate) before the first raw-data write, 0 if none */
    uint64_t extends;        /* raw-data writes past the file's end that sized it first (ftruncate) */
    int error;               /* first I/O error seen (-errno), 0 if none */
} fmt_vfd_stats;

typedef struct fmt_vfd_opts {
    enum fmt_io_mode mode; /* FMT_IO_AUTO: RK_IO if set, else io_uring + O_DIRECT where possible */
    int queue_depth;       /* 0: default 16, 32 with zero_copy (1..256) */
    size_t piece;          /* 0: default 1 MiB, 4 MiB with zero_copy; rounded to 4 KiB. Staging
                              memory (allocated as used, freed at close): queue_depth x piece */
    bool zero_copy;        /* caller promises raw-data buffers given to H5Dwrite stay untouched
                              until H5Fclose returns: the driver may hand them to the kernel
                              (the driver turns HDF5's data sieve off, so raw data reaches it
                              straight from H5Dwrite's buffer unless a type conversion runs) */
    fmt_vfd_stats *stats;  /* caller-owned, filled at open and updated to close; may be NULL */
    size_t split_max;      /* 0: 1 GiB; the most one kernel write or read is asked to move
                              (io_uring lengths are 32-bit, pwrite stops near 2 GiB); tests
                              lower it to exercise the splitting of huge tensors */
    size_t writeback;      /* 0: 32 MiB; the buffered path starts the write-back of what it
                              wrote every `writeback` bytes (and writes pieces of at most that) */
    uint64_t prealloc;     /* 0: none; the file's expected final size (an estimate; more is
                              fine): before its first raw-data write the file is allocated
                              whole, [0, prealloc) (fallocate, invariant 10), on every path */
} fmt_vfd_opts;

/* Closes a file opened through the driver's fapl: H5Fflush, then H5Fclose, and returns
   0 only if every byte reached the disk durably: otherwise the first error (-errno,
   also in stats->error; RK_E_HDF5 for an HDF5 failure). *file = H5I_INVALID_HID, always.
   Use it instead of H5Fclose for files written through the driver: an I/O error makes a
   plain H5Fclose fail too, and HDF5 1.10 then keeps the file's id pointing at freed memory
   and crashes at exit when it closes it again; fmt_vfd_close reports the error through
   H5Fflush (harmless) and lets H5Fclose itself succeed. Also valid for other files. */
int fmt_vfd_close(hid_t *file);

/* A new file-access property list using the driver (H5Pclose it). H5I_INVALID_HID (<0) on
   failure. o may be NULL (defaults). The options are copied. */
hid_t fmt_vfd_fapl(const fmt_vfd_opts *o);

#endif
