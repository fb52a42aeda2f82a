/*
 * recover/api_det.c - the failure detector's seam into the API.
 * The detector (detector/) is not built yet: rk_init runs without one and says so at
 * info level; nothing here pretends that failures are being watched.
 */
#include "rec_internal.h"

int rec_det_open(rk_ctx *ctx)
{
    (void)ctx;
    RK_LOG_INFO(RK_SUB_DET, "failure detector not built yet: peers are not watched");
    return 0;
}

void rec_det_close(rk_ctx *ctx)
{
    (void)ctx;
}

int rec_det_status(rk_ctx *ctx)
{
    (void)ctx;
    return 0;
}
