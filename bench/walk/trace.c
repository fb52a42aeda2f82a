/*
 * bench/walk_trace.c - the call recorder of bench/walk.sh: preloaded into a program whose
 * library was built with -finstrument-functions, it records every function entry and exit
 * of each thread (the function's offset in its module, and the module) and writes them,
 * at exit, to $RK_WALK_OUT.<pid>: one line per event, "> module offset" or "<". Built
 * without instrumentation; a fixed buffer per thread (events past it are counted, not
 * kept, and the count is written).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define NI __attribute__((no_instrument_function))
#define MAX_EVENTS (1u << 22)
#define MAX_THREADS 64

struct trace {
    void **fn; /* NULL: an exit */
    size_t n, lost;
};

static struct trace traces[MAX_THREADS];
static int ntraces;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread struct trace *mine;
static __thread int busy;

NI static struct trace *get(void)
{
    if (mine || busy)
        return mine;
    busy = 1;
    pthread_mutex_lock(&lock);
    if (ntraces < MAX_THREADS) {
        struct trace *t = &traces[ntraces];
        t->fn = malloc(MAX_EVENTS * sizeof(*t->fn));
        if (t->fn)
            mine = t, ntraces++;
    }
    pthread_mutex_unlock(&lock);
    busy = 0;
    return mine;
}

NI static void put(void *fn)
{
    struct trace *t = get();
    if (!t)
        return;
    if (t->n < MAX_EVENTS)
        t->fn[t->n++] = fn;
    else
        t->lost++;
}

NI void __cyg_profile_func_enter(void *fn, void *site)
{
    (void)site;
    put(fn);
}

NI void __cyg_profile_func_exit(void *fn, void *site)
{
    (void)fn, (void)site;
    put(NULL);
}

NI __attribute__((destructor)) static void dump(void)
{
    const char *out = getenv("RK_WALK_OUT");
    if (!out)
        return;
    char path[4096];
    snprintf(path, sizeof(path), "%s.%d", out, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < ntraces; k++) {
        struct trace *t = &traces[k];
        fprintf(f, "thread %d lost %zu\n", k, t->lost);
        for (size_t i = 0; i < t->n; i++) {
            Dl_info d;
            if (!t->fn[i])
                fputs("<\n", f);
            else if (dladdr(t->fn[i], &d) && d.dli_fname)
                fprintf(f, "> %s %lx\n", d.dli_fname, (unsigned long)((char *)t->fn[i] - (char *)d.dli_fbase));
            else
                fputs("> ? 0\n", f);
        }
    }
    pthread_mutex_unlock(&lock);
    fclose(f);
}
