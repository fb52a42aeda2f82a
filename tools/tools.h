/*
 * tools/tools.h - what the subcommands of the `rekindle` CLI share.
 *
 * Exit status (contract section 4): 0 success, 1 the checked thing is bad (corrupt,
 * incomplete), 2 usage or environment error. Errors go to stderr as one line saying
 * what and where, through tool_error().
 *
 * A subcommand is `int cmd_NAME(int argc, char **argv)` (argv[0] is the subcommand's
 * name) in its own file tools/cmd_*.c; the table in rekindle.c refers to it weakly, so
 * a subcommand whose file is not built yet is reported as not available.
 */
#ifndef RK_TOOLS_H
#define RK_TOOLS_H

#include <stdbool.h>
#include <stdint.h>

#include "../common/common.h"

enum { TOOL_OK = 0, TOOL_BAD = 1, TOOL_USAGE = 2 };

/* Prints "rekindle: <message>" on stderr; returns `status` for `return tool_error(...)`. */
int tool_error(int status, const char *fmt, ...) RK_PRINTF(2, 3);

/* Progress on a terminal for long operations: a line rewritten in place on stderr while
   stderr is a terminal, nothing otherwise. tool_progress_done() ends the line. */
typedef struct tool_progress {
    const char *what;
    uint64_t total, done;
    int64_t last_ns, start_ns;
    bool tty;
} tool_progress;
void tool_progress_start(tool_progress *p, const char *what, uint64_t total);
void tool_progress_add(tool_progress *p, uint64_t n);
void tool_progress_done(tool_progress *p);

/* "1.5 GiB" etc. into buf. */
const char *tool_human_bytes(uint64_t n, char *buf, int cap);

#define TOOL_CMD(name) int cmd_##name(int argc, char **argv) __attribute__((weak))
TOOL_CMD(ls);
TOOL_CMD(verify);
TOOL_CMD(inspect);
TOOL_CMD(restore);
TOOL_CMD(gc);
TOOL_CMD(run);

#endif
