/*
 * common/mem.c - large anonymous regions (checkpoint staging, partner copies, a rebuild's
 * new slices), mapped so that their first touch is cheap.
 *
 * Writing a fresh 4 KiB page costs a fault each; on virtual machines the first write to
 * guest memory also costs the hypervisor's fault. Measured on a 2-core VM (2026-11-23,
 * docs/BENCHMARKS.md "First touch"): 512 MiB of malloc + memset 1.5 s; the same region
 * advised MADV_HUGEPAGE and populated for writing 0.04-0.85 s. So a region is advised for
 * transparent huge pages (where the kernel allows it: "madvise" mode) and populated for
 * writing at once (MADV_POPULATE_WRITE, Linux 5.14; older kernels fault it in on first
 * use, as before). Advice that is refused changes nothing but speed.
 *
 * rk__map_lazy leaves out the population, for a region whose first writer waits on
 * something slower anyway: a restore's staging, which the O_DIRECT reads fault in as they
 * are submitted while the disk works on the reads before them (ckpt/ckpt_restore.c), where
 * populating 1 GiB first cost 0.12-1.1 s before the first read went out.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static void *map_region(size_t bytes, bool populate)
{
    if (bytes == 0)
        bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    if (populate)
        (void)madvise(p, bytes, MADV_POPULATE_WRITE);
    return p;
}

void *rk__map(size_t bytes)
{
    return map_region(bytes, true);
}

void *rk__map_lazy(size_t bytes)
{
    return map_region(bytes, false);
}

void *rk__remap(void *p, size_t old_bytes, size_t bytes)
{
    if (!p || old_bytes == 0)
        return rk__map(bytes);
    if (bytes <= old_bytes)
        return p;
    void *q = mremap(p, old_bytes, bytes, MREMAP_MAYMOVE);
    if (q == MAP_FAILED)
        return NULL;
    /* The pages already there move along (no new first touch); the tail is new. */
    size_t lo = (old_bytes + 4095) & ~(size_t)4095;
    if (lo < bytes) {
        (void)madvise((char *)q + lo, bytes - lo, MADV_HUGEPAGE);
        (void)madvise((char *)q + lo, bytes - lo, MADV_POPULATE_WRITE);
    }
    return q;
}

void rk__unmap(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes ? bytes : 1);
}
