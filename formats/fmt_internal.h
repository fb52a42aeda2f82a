/* formats/fmt_internal.h - shared by the files of formats/ only. */
#ifndef RK_FMT_INTERNAL_H
#define RK_FMT_INTERNAL_H

#include "fmt.h"

/* qsort order of manifest entries (const fmt_tensor *): by registration order, then by
   rank (fmt_index.c; the index writer and the reader list tensors alike). */
int fmt__cmp_order(const void *a, const void *b);

/* The restore's reads (fmt_readdirect.c, invariants R1-R6 in its header). A run: len
   bytes at off of shard `rank`, read into dst, which has room bytes (>= len), and checked
   in units of `unit` bytes (the last may be shorter), sums[k] the XXH3-64 of unit k: a
   whole tensor is one unit (unit_rows 0), a sharded piece's whole blocks one each
   (unit_rows rows each, the first being block block0 of its piece: the error names
   their rows). */
typedef struct fmt_direct fmt_direct;
struct fmt_run {
    const char *name;
    int rank;
    uint64_t off, len;
    char *dst;
    uint64_t room;
    uint64_t unit;
    const uint64_t *sums;
    uint64_t unit_rows, block0;
};
void fmt_direct_free(fmt_direct **d);
/* Reads runs[0..n) of c's shards (whose buffered descriptors c->fds are open), many reads
   in flight across them, each checked as it completes. drop: the reader may read straight
   into a 4 KiB-aligned dst with O_DIRECT, and should a read never complete, replace the
   pages under it with zeros (private anonymous memory only: staging, malloc'd); else
   O_DIRECT goes through the reader's own buffers. 0, or the first error (logged at
   debug, in rk_last_error) naming the tensor and file; dst then holds any bytes. */
int fmt__read_runs(fmt_ckpt *c, struct fmt_run *runs, size_t n, bool drop);

#endif
