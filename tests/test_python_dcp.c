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

/* tests/py/<script> BUILD WORK under RK_TEST_PYTHON: exit 0 and the line `ok`. */
static void py_check(const char *tag, const char *name, const char *ok, int timeout_s)
{
    char *work = th_tmpdir(tag);
    char *script = th_py_script(name);
    char *argv[] = {th_python, script, (char *)getenv("RK_TEST_BUILD"), work, NULL};
    th_py_expect(argv, 0, ok, timeout_s);
    free(script);
    free(work);
}

/* FSDP2 on 2 workers: dcp.save then dcp.async_save through rekindle.dcp.Writer (keep=1
   leaves the second); rekindle verify/ls, h5py and rekindle.load read every weight whole;
   dcp.load through rekindle.dcp.Reader on 3 FSDP2 workers (resharding) gives back every
   parameter and Adam moment, and on one process the plain model's. */
START_TEST(dcp_save_async_reshard_load)
{
    py_check("py-dcp", "dcp_check.py", "dcp_check: ok", 540);
}
END_TEST

/* rekindle.dcp.Reader on 2 workers of one machine loading the same replicated state dict,
   cold: with shared=False each reads every byte from the disk (O_DIRECT: the two sum to
   ~2x the data); by default the coordinator sees both read every tensor and their batches
   go through the page cache (rk_reader_read_many's RK_READ_SHARED, recover/api_read.c A3):
   under 1.5x (before, 2.13x: each read it for itself); every value back, a non-contiguous
   destination and DCP's bytes included (tests/py/dcp_read_check.py). */
START_TEST(dcp_load_replicated_reads_disk_once)
{
    py_check("py-dcp-read", "dcp_read_check.py", "dcp_read_check: ok", 300);
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
    tcase_add_test(tc, dcp_load_replicated_reads_disk_once);
    suite_add_tcase(s, tc);
    return th_main(s);
}
