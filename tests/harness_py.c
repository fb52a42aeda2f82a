/* tests/harness_py.c - see harness_py.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "harness_py.h"

char th_python[4096];
static char pypath[4200], libpath[4200], preload[4200], asan_options[256];
/* The package loads the library of the build under test, not whichever build/ it finds
   next to it; a sanitized build's needs its runtime preloaded (sanitized()). */
static const char *env_extra[] = {pypath, libpath, NULL, NULL, NULL};

static const char *src_dir(void)
{
    const char *src = getenv("RK_TEST_SRC");
    return src ? src : ".";
}

char *th_py_script(const char *name)
{
    char *p = NULL;
    if (asprintf(&p, "%s/tests/py/%s", src_dir(), name) < 0)
        return NULL;
    return p;
}

/* A SANITIZE=1 library in the uninstrumented interpreter: ASan's runtime must come first
   in the processes that load it, so it is preloaded (into the launcher and mpirun too,
   which is harmless), with libstdc++ so that its __cxa_throw interceptor finds the real
   one (torch throws C++ exceptions). Leak checking is off there: CPython and torch keep
   memory to their exit by design; the library's leaks are the C suites' to find. */
static void sanitized(void)
{
    const char *san = getenv("RK_TEST_SANITIZE");
    if (!san || strcmp(san, "1") != 0)
        return;
    char *out = NULL;
    int rc = th_sh("mpicc -print-file-name=libasan.so && mpicc -print-file-name=libstdc++.so", 60, &out);
    char *nl = out ? strchr(out, '\n') : NULL;
    if (rc != 0 || !nl || out[0] != '/' || nl[1] != '/') {
        char msg[600];
        snprintf(msg, sizeof(msg), "a sanitized build, and mpicc -print-file-name does not name ASan's runtime and "
                 "libstdc++ to preload into python: %.400s", out ? out : "");
        free(out);
        th_skip_suite(msg);
    }
    *nl = ' ';
    out[strcspn(out, "\n")] = '\0';
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", out);
    free(out);
    snprintf(asan_options, sizeof(asan_options), "ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0");
    env_extra[2] = preload;
    env_extra[3] = asan_options;
}

void th_py_setup(const char *code, const char *why)
{
    const char *py = getenv("RK_TEST_PYTHON"), *build = getenv("RK_TEST_BUILD");
    snprintf(th_python, sizeof(th_python), "%s",
             py ? py : access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3");
    snprintf(pypath, sizeof(pypath), "PYTHONPATH=%s/python", src_dir());
    snprintf(libpath, sizeof(libpath), "REKINDLE_LIB=%s/lib/librekindle.so.1", build ? build : "build");
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s -c '%s' 2>&1", th_python, code);
    if (th_sh(cmd, 120, &out) != 0) {
        const char *o = out ? out : "", *last = o;
        /* The exception's line, not the whole traceback. */
        for (const char *p = o; (p = strchr(p, '\n')) && p[1]; p++)
            last = p + 1;
        char msg[4800];
        snprintf(msg, sizeof(msg), "%s: %s: %.300s", th_python, why, last);
        msg[strcspn(msg, "\n")] = '\0';
        free(out);
        th_skip_suite(msg);
    }
    free(out);
    sanitized();
}

void th_py_expect(char *const argv[], int ranks, const char *want, int timeout_s)
{
    char *out = NULL;
    int rc = ranks ? th_mpirun(ranks, argv, env_extra, timeout_s, &out) : th_run(argv, env_extra, timeout_s, &out);
    const char *o = out ? out : "";
    size_t len = strlen(o);
    /* Check carries at most a few KiB of message: the tail of the output goes there, all
       of it to the suite's log. */
    if (rc != 0 || !strstr(o, want))
        fprintf(stderr, "---- %s %s: output ----\n%s\n", argv[1], argv[2] ? argv[2] : "", o);
    ck_assert_msg(rc == 0 && strstr(o, want), "%s %s: exit %d, want \"%s\"; output's tail:\n%s", argv[1],
                  argv[2] ? argv[2] : "", rc, want, len > 3000 ? o + len - 3000 : o);
    free(out);
}
