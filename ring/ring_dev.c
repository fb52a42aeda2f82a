/*
 * ring/ring_dev.c - the membership logic of the NCCL ring (ring_nccl.c) that needs no
 * device: which NCCL ranks a shrink excludes, and when a process names a host of its own
 * for NCCL. Built in every build (ring_nccl.c only with CUDA + NCCL), so the CPU-only
 * tests check what the device path decides (tests/test_ring.c).
 */
#include <stdio.h>
#include <string.h>

#include "ring.h"

static bool listed(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

enum ring_nccl_plan ring_nccl_plan(const int *old, int nold, const int *now, int nnow, int *excl, int *nexcl)
{
    *nexcl = 0;
    for (int i = 0; i < nnow; i++)
        if (!listed(old, nold, now[i]))
            return RING_NCCL_FRESH; /* a spare joins: NCCL cannot grow a communicator */
    for (int j = 0; j < nold; j++)
        if (!listed(now, nnow, old[j]))
            excl[(*nexcl)++] = j;
    return *nexcl == 0 ? RING_NCCL_KEEP : RING_NCCL_SHRINK;
}

bool ring_nccl_hostid(char *out, size_t cap, const char *existing, const char *host, int rank, int local_size,
                      int ndevices)
{
    if ((existing && existing[0]) || local_size < 1 || local_size <= ndevices || !out || cap == 0)
        return false;
    char id[320];
    int n = snprintf(id, sizeof(id), "%.255s-rk%d", host && host[0] ? host : "host", rank);
    if (n <= 0 || (size_t)n >= cap)
        return false;
    memcpy(out, id, (size_t)n + 1);
    return true;
}
