/* formats/fmt_internal.h - shared by the files of formats/ only. */
#ifndef RK_FMT_INTERNAL_H
#define RK_FMT_INTERNAL_H

#include "fmt.h"

/* qsort order of manifest entries (const fmt_tensor *): by registration order, then by
   rank (fmt_index.c; the index writer and the reader list tensors alike). */
int fmt__cmp_order(const void *a, const void *b);

/* The O_DIRECT reader of large tensors at restore (fmt_readdirect.c). */
typedef struct fmt_direct fmt_direct;
#define FMT_DIRECT_MIN (1u << 20) /* smaller tensors are read with pread */
void fmt_direct_free(fmt_direct **d);
/* Reads tensor t (t->offset 4 KiB-aligned) of shard `path` into buf, its XXH3-64 into
   *hash. -EOPNOTSUPP: O_DIRECT or io_uring cannot be used here (said once in the log):
   read it another way. */
int fmt__read_direct(fmt_ckpt *c, const fmt_tensor *t, const char *path, void *buf, uint64_t *hash);

#endif
