/*
 * formats/fmt_layout.c - names of checkpoint directories, listing committed steps, and
 * the balanced assignment of tensors to the ranks that write them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"

#define STEP_PREFIX "step-"
#define TMP_PREFIX ".tmp-step-"
#define STEP_DIGITS 12

void fmt_step_name(char *buf, size_t cap, int64_t step)
{
    snprintf(buf, cap, STEP_PREFIX "%0*" PRId64, STEP_DIGITS, step);
}

void fmt_tmp_name(char *buf, size_t cap, int64_t step, uint64_t nonce)
{
    snprintf(buf, cap, TMP_PREFIX "%0*" PRId64 "-%016" PRIx64, STEP_DIGITS, step, nonce);
}

static bool parse_digits(const char *s, int64_t *step)
{
    int64_t v = 0;
    for (int i = 0; i < STEP_DIGITS; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (s[STEP_DIGITS] != '\0')
        return false;
    *step = v;
    return true;
}

bool fmt_parse_step_name(const char *name, int64_t *step)
{
    int64_t dummy;
    if (strncmp(name, STEP_PREFIX, strlen(STEP_PREFIX)) != 0)
        return false;
    return parse_digits(name + strlen(STEP_PREFIX), step ? step : &dummy);
}

bool fmt_is_tmp_name(const char *name)
{
    return strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0;
}

bool fmt_parse_tmp_name(const char *name, int64_t *step, uint64_t *nonce)
{
    char digits[STEP_DIGITS + 1];
    int64_t s;
    uint64_t v = 0;
    if (!fmt_is_tmp_name(name) || strlen(name) != strlen(TMP_PREFIX) + STEP_DIGITS + 1 + 16)
        return false;
    const char *p = name + strlen(TMP_PREFIX);
    memcpy(digits, p, STEP_DIGITS);
    digits[STEP_DIGITS] = '\0';
    if (!parse_digits(digits, &s) || p[STEP_DIGITS] != '-')
        return false;
    for (const char *h = p + STEP_DIGITS + 1; *h; h++) {
        int d = (*h >= '0' && *h <= '9') ? *h - '0' : (*h >= 'a' && *h <= 'f') ? *h - 'a' + 10 : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    if (step)
        *step = s;
    if (nonce)
        *nonce = v;
    return true;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

struct step_list {
    int64_t *steps;
    size_t n, cap;
};

static int add_step(void *arg, const char *name)
{
    struct step_list *l = arg;
    int64_t s;
    if (!fmt_parse_step_name(name, &s))
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        int64_t *p = realloc(l->steps, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        l->steps = p;
        l->cap = cap;
    }
    l->steps[l->n++] = s;
    return 0;
}

int fmt_list_steps(const char *dir, int64_t **steps, size_t *n)
{
    struct step_list l = {0};
    int rc = fmt_list_dir(dir, add_step, &l);
    *steps = NULL;
    *n = 0;
    if (rc) {
        free(l.steps);
        return rc;
    }
    if (l.n)
        qsort(l.steps, l.n, sizeof(*l.steps), cmp_i64);
    *steps = l.steps;
    *n = l.n;
    return 0;
}

struct by_size {
    uint64_t size;
    size_t idx;
};

static int cmp_by_size(const void *a, const void *b)
{
    const struct by_size *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

int fmt_assign(const uint64_t *sizes, size_t n, int world, int *out_rank)
{
    if (world <= 1) {
        for (size_t i = 0; i < n; i++)
            out_rank[i] = 0;
        return 0;
    }
    struct by_size *v = malloc((n ? n : 1) * sizeof(*v));
    uint64_t *load = calloc((size_t)world, sizeof(*load));
    if (!v || !load) {
        free(v);
        free(load);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = (struct by_size){sizes[i], i};
    qsort(v, n, sizeof(*v), cmp_by_size);
    for (size_t k = 0; k < n; k++) {
        int best = 0;
        for (int r = 1; r < world; r++)
            if (load[r] < load[best])
                best = r;
        out_rank[v[k].idx] = best;
        load[best] += v[k].size + 1; /* +1: zero-size tensors still spread */
    }
    free(v);
    free(load);
    return 0;
}
