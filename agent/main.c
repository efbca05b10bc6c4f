/* gpusync-agent: the program gpusync runs on the server. A command table dispatches to `serve`
 * (file operations over the sync protocol, proto/sync.h), to `launch`, `tail`, `ps` and `stop`
 * (runs and their logs, proto/run.h), to `sample` (the live readings of `gpusync top`) and to
 * `net` (probes for multi-node runs). Errors and usage go to stderr; while serving, stdout carries
 * protocol frames only. */
// Build without cmake, from the repository root (what the client does on a server with only a
// compiler; xxhash.h must be in the include path); add -static for a self-contained binary:
//
//     cc -std=c99 -O2 -I. -o gpusync-agent agent/*.c proto/*.c
//
// The fuzz target lives in agent/fuzz/ so that this glob does not pick it up.
/* POSIX.1-2008 with XSI (realpath); _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"
#include "net.h"
#include "proto/run.h"
#include "proto/sync.h"
#include "runlog.h"
#include "resident.h"
#include "runs.h"
#include "sample.h"
#include "serve.h"
#include "wrapper.h"

struct agent_cmd {
    const char *name;
    const char *usage;
    const char *summary;
    int (*run)(int argc, char **argv);
};

static int cmd_serve(int argc, char **argv);

static const struct agent_cmd agent_cmds[] = {
    {"serve", "serve --root DIR [--fsync]",
     "execute file requests from stdin against DIR (created if missing)", cmd_serve},
    {GS_PROTO_RUN_LAUNCH, "launch --root DIR --id ID --nproc N ... -- CMD ARGS...",
     "start a supervised run of N ranks, detached", ga_launch_main},
    {GS_PROTO_RUN_TAIL, "tail --root DIR --id ID [--follow]", "stream a run's rank logs as frames",
     ga_tail_main},
    {GS_PROTO_RUN_PS, "ps --root DIR [--json]", "list the runs in DIR", ga_ps_main},
    {GS_PROTO_RUN_STOP, "stop --root DIR --id ID", "stop a run and every process of it",
     ga_stop_main},
    {GS_PROTO_RUN_SAMPLE, "sample [--root DIR] [--interval-ms N] [--count N]",
     "stream CPU, memory, disk, network, GPU and run readings, one JSON line per interval",
     ga_sample_main},
    {"listen", "listen --socket PATH",
     "the resident listener: serve each connection to PATH (started by serve, detached)",
     ga_resident_main},
    {GS_PROTO_RUN_NET, "net src ADDR | listen | connect ADDR PORT",
     "network probes for multi-node runs (route source, TCP reachability)", ga_net_main},
};

#define N_CMDS (sizeof(agent_cmds) / sizeof(agent_cmds[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: gpusync-agent [--version] [--help] COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < N_CMDS; i++)
        fprintf(f, "  %-30s %s\n", agent_cmds[i].usage, agent_cmds[i].summary);
}

/* Writes all replies to stdout (fd 1); fails on EPIPE and the like. */
static int write_stdout(void *ctx, const uint8_t *p, size_t n)
{
    (void)ctx;
    return ga_write_all(1, p, n);
}

static int cmd_serve(int argc, char **argv)
{
    const char *root = NULL;
    int fsync_all = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--root") && i + 1 < argc)
            root = argv[++i];
        else if (!strcmp(argv[i], "--fsync"))
            fsync_all = 1;
        else {
            fprintf(stderr, "gpusync-agent serve: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!root) {
        fprintf(stderr, "usage: gpusync-agent %s\n", agent_cmds[0].usage);
        return 2;
    }
    /* A vanished client must end in a write error, not a silent death by SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    struct ga_serve s;
    char err[512];
    if (ga_serve_init(&s, root, 1, write_stdout, NULL, err, sizeof(err)) < 0) {
        fprintf(stderr, "gpusync-agent: %s\n", err);
        return 1;
    }
    s.fsync = fsync_all;
    s.writer = 1; /* the only writer of root once HELLO is answered (fence.h) */
    int status = ga_serve_run(&s, 0);
    ga_serve_release(&s);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("gpusync-agent %s (protocol %d)\n", GA_AGENT_VERSION, GS_PROTO_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < N_CMDS; i++)
        if (!strcmp(argv[1], agent_cmds[i].name))
            return agent_cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "gpusync-agent: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
