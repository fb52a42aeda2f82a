/*
 * tests/test_python_cuda.c - the Python package and examples/torch_train.py on CUDA
 * tensors (docs/GPU.md): registration from tensor.is_cuda, allreduce of CUDA tensors and
 * gradients, snapshots copied from the device while the next step runs, resume into the
 * device, rekindle.load(map_location=...), the trainer's --device cuda reproducible and
 * surviving a SIGKILLed worker with the hash of a replay; the torch.distributed backend
 * "rekindle" on CUDA tensors: every collective exact on 3 ranks, and an unchanged DDP on the
 * device that loses a worker inside its backward pass. The checks are Python
 * (tests/py/cuda_check.py, tests/py/job_check.py, tests/py/backend_check.py --device cuda).
 *
 * Needs a GPU and a torch with CUDA: skipped with the reason otherwise (scripts/gpu-check
 * runs it where there is one). Without scikit-learn, the trainer reads the digits from
 * RK_TEST_DIGITS (sklearn's digits.csv.gz, which gpu-check carries).
 */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "harness_py.h"

static char *script_cuda, *script_job, *digits;

static void api_on(int ranks)
{
    char *dir = th_tmpdir("py-cuda");
    char *w[] = {th_python, script_cuda, dir, "write", NULL}, *r[] = {th_python, script_cuda, dir, "read", NULL};
    th_py_expect(w, ranks, "cuda_check write: ok", 150);
    th_py_expect(r, ranks, "cuda_check read: ok", 150);
    free(dir);
}

/* CUDA tensors through register, allreduce, checkpoints at every step, resume and load. */
START_TEST(api_one_process)
{
    api_on(0);
}
END_TEST

START_TEST(api_two_ranks)
{
    api_on(2);
}
END_TEST

/* torch_train.py --device cuda: the same bits twice, on one worker and on two. */
START_TEST(trainer_reproducible)
{
    char *work = th_tmpdir("py-cuda-train");
    char *argv[] = {th_python, script_cuda, (char *)getenv("RK_TEST_BUILD"), work, "train",
                    digits ? "--data" : NULL, digits, NULL};
    th_py_expect(argv, 0, "cuda_check train: ok", 300);
    free(work);
}
END_TEST

/* One of 4 workers of torch_train.py --device cuda SIGKILLed: the survivors end with the
   hash of a fault-free replay on the device. */
START_TEST(killed_worker_replay)
{
    char *work = th_tmpdir("py-cuda-job");
    char *argv[] = {th_python, script_job, (char *)getenv("RK_TEST_BUILD"), work, "kill", "--device", "cuda",
                    digits ? "--data" : NULL, digits, NULL};
    char want[4200];
    snprintf(want, sizeof(want), "job_check kill --device cuda%s%s: ok", digits ? " --data " : "", digits ? digits : "");
    th_py_expect(argv, 0, want, 540);
    free(work);
}
END_TEST

/* tests/py/backend_check.py MODE --device cuda on `ranks` ranks (0: one process). */
static void backend_on_cuda(const char *mode, int ranks, const char *want)
{
    char *dir = th_tmpdir("py-cuda-backend"), *script = th_py_script("backend_check.py");
    char *argv[] = {th_python, script, (char *)getenv("RK_TEST_BUILD"), dir, (char *)mode, "--device", "cuda", NULL};
    th_py_expect(argv, ranks, want, 300);
    free(script);
    free(dir);
}

/* The backend's collectives on CUDA tensors of device 0, 3 ranks (backend_check.py P1-P5). */
START_TEST(backend_collectives_on_cuda)
{
    backend_on_cuda("collectives", 3, "backend_check collectives: ok");
}
END_TEST

/* An unchanged DDP on the device over the backend, one of 3 workers SIGKILLed inside its
   backward pass: Recovered from optimizer.step(), the survivors' states equal (P4). */
START_TEST(backend_ddp_loses_a_worker_on_cuda)
{
    backend_on_cuda("loss", 0, "backend_check loss: ok");
}
END_TEST

int main(void)
{
    char why[256];
    if (!th_have_gpu(why, sizeof(why)))
        th_skip_suite(why);
    digits = getenv("RK_TEST_DIGITS");
    th_py_setup(digits ? "import torch, numpy; assert torch.cuda.is_available(), \"torch.cuda.is_available() is False\""
                       : "import torch, numpy, sklearn; assert torch.cuda.is_available(), \"torch.cuda.is_available() is False\"",
                digits ? "needs torch with CUDA and numpy"
                       : "needs torch with CUDA, numpy and scikit-learn (or RK_TEST_DIGITS naming sklearn's digits.csv.gz)");
    script_cuda = th_py_script("cuda_check.py");
    script_job = th_py_script("job_check.py");
    Suite *s = suite_create("python_cuda");
    TCase *tc = tcase_create("api");
    tcase_set_timeout(tc, 360);
    tcase_add_test(tc, api_one_process);
    tcase_add_test(tc, api_two_ranks);
    suite_add_tcase(s, tc);
    tc = tcase_create("job");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, trainer_reproducible);
    tcase_add_test(tc, killed_worker_replay);
    suite_add_tcase(s, tc);
    tc = tcase_create("backend");
    tcase_set_timeout(tc, 400);
    tcase_add_test(tc, backend_collectives_on_cuda);
    tcase_add_test(tc, backend_ddp_loses_a_worker_on_cuda);
    suite_add_tcase(s, tc);
    return th_main(s);
}
