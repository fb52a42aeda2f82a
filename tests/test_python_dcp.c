/*
 * tests/test_python_dcp.c - rekindle.dcp, the storage of torch.distributed.checkpoint
 * (python/rekindle/dcp.py), under DCP's own planners with real worker processes
 * (tests/py/dcp_check.py).
 *
 * Skipped, with the reason, when RK_TEST_PYTHON's torch lacks what it uses: Debian's
 * torch 1.13 has no StorageWriter/StorageReader of the form DCP's save/load call (reset,
 * storage_meta), no async_save, no FSDP2 (fully_shard) and no get_state_dict. Run it as
 * `make check-python_dcp PYTHON=bench/peers/venv/bin/python` (bench/peers/setup).
 */
#include <stdlib.h>

#include "harness.h"
#include "harness_py.h"

/* FSDP2 on 2 workers: dcp.save then dcp.async_save through rekindle.dcp.Writer (keep=1
   leaves the second); rekindle verify/ls, h5py and rekindle.load read every weight whole;
   dcp.load through rekindle.dcp.Reader on 3 FSDP2 workers (resharding) gives back every
   parameter and Adam moment, and on one process the plain model's. */
START_TEST(dcp_save_async_reshard_load)
{
    char *work = th_tmpdir("py-dcp");
    char *script = th_py_script("dcp_check.py");
    char *argv[] = {th_python, script, (char *)getenv("RK_TEST_BUILD"), work, NULL};
    th_py_expect(argv, 0, "dcp_check: ok", 540);
    free(script);
    free(work);
}
END_TEST

int main(void)
{
    th_py_setup("import h5py; from torch.distributed.checkpoint.storage import StorageWriter; "
                "from torch.distributed.checkpoint.state_dict import get_state_dict; "
                "from torch.distributed.fsdp import fully_shard",
                "needs torch.distributed.checkpoint (StorageWriter, get_state_dict) and FSDP2 (fully_shard), "
                "which Debian's torch 1.13 lacks: make check-python_dcp PYTHON=bench/peers/venv/bin/python");
    Suite *s = suite_create("python_dcp");
    TCase *tc = tcase_create("dcp");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, dcp_save_async_reshard_load);
    suite_add_tcase(s, tc);
    return th_main(s);
}
