/*
 * tests/test_python_backend.c - an unchanged DistributedDataParallel on the torch.distributed
 * backend "rekindle" (python/rekindle/backend.py) losing a worker: real `rekindle run` jobs,
 * real SIGKILLs (tests/py/backend_check.py, tests/py/job_check.py mode backend). The
 * backend's collectives themselves are test_python's backend_collectives (torch 1.13 too).
 *
 * Skipped, with the reason, when RK_TEST_PYTHON's torch cannot survive a loss inside DDP's
 * backward pass: Debian's torch 1.13 cannot tell a collective runs inside a backward pass
 * (no torch._C._current_autograd_node), and its DDP divides the gradients by the world
 * size of init_process_group, not the group's size now (its ProcessGroup.getSize is not
 * overridable from Python). Run it as `make check-python_backend
 * PYTHON=bench/peers/venv/bin/python` (bench/peers/setup).
 */
#include <stdlib.h>

#include "harness.h"
#include "harness_py.h"

static void backend_job(const char *script, const char *mode, const char *want)
{
    char *work = th_tmpdir("py-backend");
    char *path = th_py_script(script);
    char *argv[] = {th_python, path, (char *)getenv("RK_TEST_BUILD"), work, (char *)mode, NULL};
    th_py_expect(argv, 0, want, 540);
    free(path);
    free(work);
}

/* P4, P1: one of 3 workers SIGKILLs itself inside its backward pass; the survivors' DDP
   allreduce finds the loss, backward() returns, optimizer.step() raises Recovered before
   changing anything, the model and Adam's state are the rolled-back step's bitwise, and
   DDP goes on over 2 ranks (getSize 2) to one state. */
START_TEST(ddp_loss_in_backward_raised_by_step)
{
    backend_job("backend_check.py", "loss", "backend_check loss: ok");
}
END_TEST

/* P3, P4: tests/py/backend_train.py (written from docs/PYTHON.md alone: an unchanged DDP on
   init_process_group("rekindle")), one of 4 workers SIGKILLed once rank 0 printed step 65:
   the 3 survivors end with the hash of a fault-free replay (4 workers to the step they
   resumed at, 3 from there), whatever DDP's bucketing of the first pass after a resume. */
START_TEST(ddp_program_survives_kill_equals_replay)
{
    char *work = th_tmpdir("py-backend");
    char *script = th_py_script("job_check.py");
    char *argv[] = {th_python, script, (char *)getenv("RK_TEST_BUILD"), work, "backend", NULL};
    th_py_expect(argv, 0, "job_check backend: ok", 540);
    free(script);
    free(work);
}
END_TEST

int main(void)
{
    th_py_setup("import torch, torch.distributed as d; assert d.is_available(); "
                "assert hasattr(torch._C, \"_current_autograd_node\"), torch.__version__",
                "needs torch >= 2: a loss inside DDP's backward pass is survived where torch tells a collective "
                "runs in a backward pass (torch._C._current_autograd_node) and DDP asks the group's size at every "
                "pass (ProcessGroup.getSize from Python), which Debian's torch 1.13 lacks: "
                "make check-python_backend PYTHON=bench/peers/venv/bin/python");
    Suite *s = suite_create("python_backend");
    TCase *tc = tcase_create("ddp");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, ddp_loss_in_backward_raised_by_step);
    tcase_add_test(tc, ddp_program_survives_kill_equals_replay);
    suite_add_tcase(s, tc);
    return th_main(s);
}
