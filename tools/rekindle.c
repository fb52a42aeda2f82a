/*
 * tools/rekindle.c - the `rekindle` command: --help, --version and dispatch to the
 * subcommands (tools/cmd_*.c). Exit status: 0 ok, 1 bad thing found, 2 usage/environment.
 */
#include <stdio.h>
#include <string.h>

#include "tools.h"

static const struct command {
    const char *name;
    int (*fn)(int, char **);
    const char *usage;
    const char *summary;
} commands[] = {
    {"ls", cmd_ls, "ls DIR [--json]", "list every checkpoint under DIR: step, state, world, tensors, bytes, time"},
    {"verify", cmd_verify, "verify DIR [--step S | --all]", "re-read data and compare checksums (default: latest committed)"},
    {"inspect", cmd_inspect, "inspect DIR [--step S]", "every tensor: name, dtype, shape, bytes, file, checksum"},
    {"restore", cmd_restore, "restore DIR [--step S] --out FILE.h5", "write one self-contained HDF5 file of a checkpoint"},
    {"gc", cmd_gc, "gc DIR --keep K", "delete all but the newest K committed checkpoints (never the newest that verifies)"},
    {"run", cmd_run, "run -n N [--spares S] [--hostfile F] [--max-restarts R] -- PROGRAM [ARGS...]",
     "launch PROGRAM on N workers with Open MPI so that survivors outlive a lost worker"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: rekindle <command> [options]\n"
               "       rekindle --help | --version\n\n"
               "Checkpoints and recovery for data-parallel training.\n\ncommands:\n");
    for (size_t i = 0; i < RK_ARRAY_LEN(commands); i++)
        fprintf(f, "  %s\n      %s%s\n", commands[i].usage, commands[i].summary,
                commands[i].fn ? "" : "  [not available in this build yet]");
    fprintf(f, "\n'rekindle <command> --help' shows a command's options.\n"
               "exit status: 0 success, 1 the checked thing is bad (corrupt, incomplete),\n"
               "             2 usage or environment error.\n"
               "environment: RK_LOG=error|warn|info|debug, RK_LOG_SUBSYS=fmt,ckpt,det,ring,rec,tool\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return TOOL_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return TOOL_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("rekindle %s\n", rk_version());
        return TOOL_OK;
    }
    for (size_t i = 0; i < RK_ARRAY_LEN(commands); i++) {
        if (strcmp(cmd, commands[i].name) != 0)
            continue;
        if (!commands[i].fn)
            return tool_error(TOOL_USAGE, "%s: not available in this build yet", cmd);
        return commands[i].fn(argc - 1, argv + 1);
    }
    return tool_error(TOOL_USAGE, "unknown command '%s' (see rekindle --help)", cmd);
}
