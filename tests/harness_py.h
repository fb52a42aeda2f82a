/*
 * tests/harness_py.h - what the Python suites share (test_python.c, test_python_cuda.c):
 * the interpreter, the environment that makes it load the build under test, and running a
 * check of tests/py/ judged by its exit status and output.
 *
 * RK_TEST_PYTHON names the interpreter (default /usr/bin/python3; `python3` on PATH where
 * there is none). The package is the source tree's (PYTHONPATH=<src>/python) over the
 * build's library (REKINDLE_LIB). Under RK_TEST_SANITIZE=1 ASan's runtime is preloaded.
 */
#ifndef RK_TEST_HARNESS_PY_H
#define RK_TEST_HARNESS_PY_H

/* The interpreter the checks run under. */
extern char th_python[4096];

/* Sets the paths up, then skips the suite (th_skip_suite) unless the interpreter runs
   `code` (a Python statement, e.g. "import torch") with exit 0; `why` is what the skip
   says is missing (the reason python printed follows it). */
void th_py_setup(const char *code, const char *why);

/* "<src>/tests/py/<name>" (malloc'd). */
char *th_py_script(const char *name);

/* Runs argv (argv[0] th_python), on `ranks` MPI ranks (0: a single process); the test
   fails with the output's tail unless it exits 0 and prints `want`. */
void th_py_expect(char *const argv[], int ranks, const char *want, int timeout_s);

#endif
