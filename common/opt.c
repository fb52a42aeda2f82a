/*
 * common/opt.c - rk_options: defaults, the RK_* environment, validation.
 *
 * One table names every option: its environment variable, its field, its default and
 * its range. rk_options_init() never fails; the first variable it cannot parse is kept
 * in o->env_error and rk_init() reports it. rk__options_validate() checks the fields
 * (which a program may also set by hand) and names the bad one.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum opt_kind { OPT_INT, OPT_STR, OPT_CHOICE };

static const char *const io_choices[] = {"auto", "uring", "buffered", NULL};
static const char *const rollback_choices[] = {"auto", "disk", NULL};
static const char *const restore_choices[] = {"staged", "inplace", NULL};

static const struct opt {
    const char *env;
    enum opt_kind kind;
    size_t off;
    long def, lo, hi;            /* OPT_INT; OPT_CHOICE: def 1 if NULL means choices[0] (a
                                    field taken from rk_options' reserved room: zero is its
                                    default, rekindle.h's ABI rule) */
    const char *const *choices;  /* OPT_CHOICE; default choices[0] */
} opts[] = {
    {"RK_CKPT_DIR", OPT_STR, offsetof(rk_options, ckpt_dir), 0, 0, 0, NULL},
    {"RK_CKPT_EVERY", OPT_INT, offsetof(rk_options, ckpt_every), 100, 0, INT_MAX, NULL},
    {"RK_KEEP", OPT_INT, offsetof(rk_options, keep), 3, 1, 1000000, NULL},
    {"RK_HEARTBEAT_MS", OPT_INT, offsetof(rk_options, heartbeat_ms), 100, 5, 60000, NULL},
    {"RK_MIN_WORLD", OPT_INT, offsetof(rk_options, min_world), 1, 1, 1 << 24, NULL},
    {"RK_TIMEOUT_MS", OPT_INT, offsetof(rk_options, timeout_ms), 30000, 100, 86400000, NULL},
    {"RK_EVENT_LOG", OPT_STR, offsetof(rk_options, event_log), 0, 0, 0, NULL},
    {"RK_DET_IFACE", OPT_STR, offsetof(rk_options, det_iface), 0, 0, 0, NULL},
    {"RK_IO", OPT_CHOICE, offsetof(rk_options, io), 0, 0, 0, io_choices},
    {"RK_ROLLBACK", OPT_CHOICE, offsetof(rk_options, rollback), 0, 0, 0, rollback_choices},
    {"RK_SNAPSHOT_EVERY", OPT_INT, offsetof(rk_options, snapshot_every), 1, 0, INT_MAX, NULL},
    {"RK_RESTORE", OPT_CHOICE, offsetof(rk_options, restore), 1, 0, 0, restore_choices},
};

/* "auto, uring or buffered" for a choice option's messages. */
static void list_choices(const char *const *c, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; c[i] && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i == 0 ? "" : c[i + 1] ? ", " : " or ", c[i]);
}

int rk__parse_int(const char *s, long lo, long hi, long *out, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    if (!s || !*s) {
        *why = "empty";
        return RK_E_OPTION;
    }
    if (!(*s == '-' || *s == '+' || (*s >= '0' && *s <= '9'))) {
        *why = "not an integer";
        return RK_E_OPTION;
    }
    errno = 0;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0') {
        *why = "not an integer";
        return RK_E_OPTION;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        *why = "out of range";
        return RK_E_OPTION;
    }
    *out = v;
    return 0;
}

static int *int_field(rk_options *o, const struct opt *d)
{
    return (int *)((char *)o + d->off);
}

static const char **str_field(rk_options *o, const struct opt *d)
{
    return (const char **)((char *)o + d->off);
}

void rk_options_init(rk_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    for (size_t i = 0; i < RK_ARRAY_LEN(opts); i++) {
        const struct opt *d = &opts[i];
        if (d->kind == OPT_INT)
            *int_field(o, d) = (int)d->def;
        else if (d->kind == OPT_CHOICE)
            *str_field(o, d) = d->choices[0];
    }
    for (size_t i = 0; i < RK_ARRAY_LEN(opts); i++) {
        const struct opt *d = &opts[i];
        const char *v = getenv(d->env);
        if (!v)
            continue;
        const char *why = NULL;
        if (d->kind == OPT_INT) {
            long x;
            if (rk__parse_int(v, d->lo, d->hi, &x, &why) == 0) {
                *int_field(o, d) = (int)x;
                continue;
            }
        } else if (d->kind == OPT_STR) {
            *str_field(o, d) = *v ? v : NULL; /* set but empty: off */
            continue;
        } else {
            const char *const *c;
            for (c = d->choices; *c; c++)
                if (strcmp(*c, v) == 0)
                    break;
            if (*c) {
                *str_field(o, d) = *c;
                continue;
            }
            why = "not one of the accepted values";
        }
        if (!o->env_error[0]) {
            char range[64] = "";
            if (d->kind == OPT_INT)
                snprintf(range, sizeof(range), " (expected an integer in [%ld, %ld])", d->lo, d->hi);
            else if (d->kind == OPT_CHOICE) {
                char list[48];
                list_choices(d->choices, list, sizeof(list));
                snprintf(range, sizeof(range), " (expected %s)", list);
            }
            snprintf(o->env_error, sizeof(o->env_error), "%s='%.40s': %s%s", d->env, v, why, range);
        }
    }
}

int rk__options_validate(const rk_options *o)
{
    if (!o)
        return rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, -EINVAL, "options: NULL");
    if (o->env_error[0])
        return rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, RK_E_OPTION, "%s", o->env_error);
    for (size_t i = 0; i < RK_ARRAY_LEN(opts); i++) {
        const struct opt *d = &opts[i];
        if (d->kind == OPT_INT) {
            int v = *int_field((rk_options *)o, d);
            if (v < d->lo || v > d->hi)
                return rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, RK_E_OPTION,
                                "option %s = %d: out of range [%ld, %ld]", d->env, v, d->lo, d->hi);
        } else if (d->kind == OPT_CHOICE) {
            const char *v = *str_field((rk_options *)o, d);
            const char *const *c;
            for (c = d->choices; *c && v; c++)
                if (strcmp(*c, v) == 0)
                    break;
            if (!v && d->def)
                continue;
            if (!v || !*c) {
                char list[48];
                list_choices(d->choices, list, sizeof(list));
                return rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, RK_E_OPTION, "option %s = '%s': not one of %s", d->env,
                                v ? v : "(null)", list);
            }
        }
    }
    if (o->ckpt_dir && !*o->ckpt_dir)
        return rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, RK_E_OPTION, "option RK_CKPT_DIR: empty path (use NULL for no checkpoints)");
    return 0;
}

int rk__options_keep(rk_options *dst, const rk_options *o)
{
    *dst = *o;
    for (size_t i = 0; i < RK_ARRAY_LEN(opts); i++) {
        const struct opt *d = &opts[i];
        if (d->kind == OPT_INT)
            continue;
        const char **f = str_field(dst, d);
        if (d->kind == OPT_STR)
            *f = NULL; /* until copied: rk__options_free frees only copies */
        else
            for (const char *const *c = d->choices; *c; c++)
                if (*f && strcmp(*c, *f) == 0)
                    *f = *c; /* the table's own string */
    }
    for (size_t i = 0; i < RK_ARRAY_LEN(opts); i++) {
        const struct opt *d = &opts[i];
        const char *v = d->kind == OPT_STR ? *str_field((rk_options *)o, d) : NULL;
        if (v && !(*str_field(dst, d) = strdup(v))) {
            rk__options_free(dst);
            return rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, -ENOMEM, "options: no memory for a copy of %s", d->env);
        }
    }
    return 0;
}

void rk__options_free(rk_options *o)
{
    for (size_t i = 0; i < RK_ARRAY_LEN(opts); i++)
        if (opts[i].kind == OPT_STR) {
            free((char *)*str_field(o, &opts[i]));
            *str_field(o, &opts[i]) = NULL;
        }
}
