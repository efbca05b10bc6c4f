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

/* 1 when sscanf's fields, which end at `end`, lie within the first line of `line`: sscanf skips
 * newlines as it skips spaces, so a short line would otherwise borrow the next one's fields. */
static int within_line(const char *line, int end)
{
    return end > 0 && (size_t)end <= strcspn(line, "\n");
}

/* 1 when the fields end exactly where the line does (a CR before its LF allowed). */
static int whole_line(const char *line, int end)
{
    const char *rest = line + end + (line[end] == '\r');
    return within_line(line, end) && (*rest == '\n' || *rest == '\0');
}

int gs_proto_run_started_parse(const char *line, long *pid, int *port, int *agent_at)
{
    int end = 0;
    if (sscanf(line, STARTED "%*s %ld %d%n", pid, port, &end) < 2 || !within_line(line, end))
        return -1;
    size_t at = (size_t)end, len = strcspn(line, "\n");
    while (at < len && line[at] == ' ')
        at++;
    if (agent_at)
        *agent_at = at < len ? (int)at : 0;
    return 0;
}

#define WAITING "waiting "
#define GPUS    "gpus "

int gs_proto_run_waiting_format(char *buf, size_t cap, const char *text)
{
    return fitted(snprintf(buf, cap, WAITING "%.*s\n", (int)strcspn(text, "\n"), text), cap);
}

int gs_proto_run_waiting_parse(const char *line, char text[GS_PROTO_RUN_WAIT_MAX])
{
    size_t len = strcspn(line, "\n"), head = strlen(WAITING);
    if (strncmp(line, WAITING, head) != 0 || !line[len] || len - head >= GS_PROTO_RUN_WAIT_MAX)
        return -1;
    memcpy(text, line + head, len - head);
    text[len - head] = '\0';
    return 0;
}

int gs_proto_run_gpus_format(char *buf, size_t cap, const char *list)
{
    return fitted(snprintf(buf, cap, GPUS "%s\n", list), cap);
}

int gs_proto_run_gpus_parse(const char *line, char list[GS_PROTO_RUN_GPUS_MAX])
{
    size_t len = strcspn(line, "\n"), head = strlen(GPUS);
    if (strncmp(line, GPUS, head) != 0 || !line[len] || len == head ||
        len - head >= GS_PROTO_RUN_GPUS_MAX || strspn(line + head, "0123456789,") != len - head)
        return -1;
    memcpy(list, line + head, len - head);
    list[len - head] = '\0';
    return 0;
}

int gs_proto_run_log_format(char *buf, size_t cap, int rank, long long offset, size_t length)
{
    return fitted(snprintf(buf, cap, "L %d %lld %zu\n", rank, offset, length), cap);
}

int gs_proto_run_log_parse(const char *line, int *rank, unsigned long long *offset,
                           unsigned long long *length)
{
    int end = 0;
    if (line[0] != 'L' || sscanf(line, "L %d %llu %llu%n", rank, offset, length, &end) != 3)
        return -1;
    return whole_line(line, end) ? 0 : -1;
}

int gs_proto_run_exit_format(char *buf, size_t cap, int exit_code, const char *state,
                             const char *summary)
{
    char code[16] = "null";
    if (exit_code >= 0)
        snprintf(code, sizeof(code), "%d", exit_code);
    int has = summary && summary[0] == '{' && !strchr(summary, '\n');
    return fitted(
        snprintf(buf, cap, "X %s %s%s%s\n", code, state, has ? " " : "", has ? summary : ""), cap);
}

int gs_proto_run_exit_parse(const char *line, int *exit_code, char state[GS_PROTO_RUN_STATE_MAX],
                            int *summary_at)
{
    char code[32];
    /* %31s: GS_PROTO_RUN_STATE_MAX - 1 */
    int end = 0;
    if (line[0] != 'X' || sscanf(line, "X %31s %31s%n", code, state, &end) != 2)
        return -1;
    *summary_at = 0;
    if (line[end] == ' ' && line[end + 1] == '{' && within_line(line, end + 1)) {
        *summary_at = end + 1;
        end += (int)strcspn(line + end, "\r\n");
    }
    if (!whole_line(line, end))
        return -1;
    *exit_code = strcmp(code, "null") == 0 ? -1 : atoi(code);
    return 0;
}
