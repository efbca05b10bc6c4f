/* proto/run.c: the lines of the run protocol (see proto/run.h), formatted by the agent and
 * parsed by the client with the one format each. Pure functions over strings. */
#include "proto/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STARTED "started "

/* snprintf's result as a line length: -1 when it was cut short. */
static int fitted(int n, size_t cap)
{
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int gs_proto_run_started_format(char *buf, size_t cap, const char *id, long pid, long port,
                                const char *agent_path)
{
    return fitted(snprintf(buf, cap, STARTED "%s %ld %ld %s\n", id, pid, port, agent_path), cap);
}

int gs_proto_run_is_started(const char *line)
{
    return strncmp(line, STARTED, strlen(STARTED)) == 0;
}

int gs_proto_run_started_parse(const char *line, long *pid, int *port, int *agent_at)
{
    int at = 0;
    if (sscanf(line, STARTED "%*s %ld %d %n", pid, port, &at) < 2)
        return -1;
    if (agent_at)
        *agent_at = at && line[at] ? at : 0;
    return 0;
}

int gs_proto_run_log_format(char *buf, size_t cap, int rank, long long offset, size_t length)
{
    return fitted(snprintf(buf, cap, "L %d %lld %zu\n", rank, offset, length), cap);
}

int gs_proto_run_log_parse(const char *line, int *rank, unsigned long long *offset,
                           unsigned long long *length)
{
    return line[0] == 'L' && sscanf(line, "L %d %llu %llu", rank, offset, length) == 3 ? 0 : -1;
}

int gs_proto_run_exit_format(char *buf, size_t cap, int exit_code, const char *state)
{
    int n = exit_code >= 0 ? snprintf(buf, cap, "X %d %s\n", exit_code, state)
                           : snprintf(buf, cap, "X null %s\n", state);
    return fitted(n, cap);
}

int gs_proto_run_exit_parse(const char *line, int *exit_code, char state[GS_PROTO_RUN_STATE_MAX])
{
    char code[32];
    /* %31s: GS_PROTO_RUN_STATE_MAX - 1 */
    if (line[0] != 'X' || sscanf(line, "X %31s %31s", code, state) != 2)
        return -1;
    *exit_code = strcmp(code, "null") == 0 ? -1 : atoi(code);
    return 0;
}
