/* cli/run_end.c: the summary of a run's end (see run_end.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sigabbrev_np */
#endif
#include "cli/run_end.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static long long int_or(json_t *o, const char *key, long long def)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : def;
}

/* "12.3 s", "4m05s", "2h03m". */
static void duration_text(long long ms, char *buf, size_t cap)
{
    if (ms < 0)
        snprintf(buf, cap, "an unknown time");
    else if (ms < 60000)
        snprintf(buf, cap, "%.1f s", (double)ms / 1000.0);
    else if (ms < 3600000)
        snprintf(buf, cap, "%lldm%02llds", ms / 60000, ms / 1000 % 60);
    else
        snprintf(buf, cap, "%lldh%02lldm", ms / 3600000, ms / 60000 % 60);
}

void gs_run_end_failure(json_t *failed, char *buf, size_t cap)
{
    long long rank = int_or(failed, "rank", -1), sig = int_or(failed, "signal", 0);
    long long code = int_or(failed, "exit_code", -1);
    const char *abbrev = sig > 0 && sig < NSIG ? sigabbrev_np((int)sig) : NULL;
    int n;
    if (sig > 0)
        n = snprintf(buf, cap, "rank %lld was killed by SIG%s", rank, abbrev ? abbrev : "?");
    else
        n = snprintf(buf, cap, "rank %lld exited with %lld", rank, code);
    if (n < 0 || (size_t)n >= cap)
        return;
    if (json_is_true(json_object_get(failed, "oom"))) {
        const char *scope = json_string_value(json_object_get(failed, "oom_scope"));
        snprintf(buf + n, cap - (size_t)n, ": out of memory (the kernel's OOM killer %s)",
                 scope && !strcmp(scope, "cgroup") ? "killed it in the run's cgroup"
                                                   : "killed a process on the server as it died");
    } else if (sig == SIGKILL)
        snprintf(buf + n, cap - (size_t)n, " (not by gpusync; no OOM kill was counted)");
}

/* ", ranks 0,2 were stopped" for the ranks the supervisor ended because of the failure. */
static void stopped_text(json_t *ranks, char *buf, size_t cap)
{
    size_t n = json_array_size(ranks), at = 0;
    buf[0] = '\0';
    if (n == 0)
        return;
    at += (size_t)snprintf(buf, cap, "; %s ", n == 1 ? "rank" : "ranks");
    for (size_t i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? "," : "",
                               (long long)json_integer_value(json_array_get(ranks, i)));
    if (at < cap)
        snprintf(buf + at, cap - at, " %s stopped", n == 1 ? "was" : "were");
}

/* The human line (and the failing rank's last lines) on stderr. */
static void print_text(const char *id, const char *state, int exit_code, json_t *s)
{
    char dur[32], why[512] = "", stopped[256] = "", extra[128] = "";
    duration_text(int_or(s, "duration_ms", -1), dur, sizeof(dur));
    json_t *failed = json_object_get(s, "failed");
    if (json_is_object(failed))
        gs_run_end_failure(failed, why, sizeof(why));
    stopped_text(json_object_get(s, "stopped_ranks"), stopped, sizeof(stopped));
    long long others = int_or(s, "others_termed", 0), killed = int_or(s, "killed_count", 0);
    if (others || killed)
        snprintf(extra, sizeof(extra),
                 "; %lld other process%s stopped, %lld killed after the grace", others,
                 others == 1 ? "" : "es", killed);
    char exit_s[16] = "unknown";
    if (exit_code >= 0)
        snprintf(exit_s, sizeof(exit_s), "%d", exit_code);
    fprintf(stderr, "gpusync: run %s %s after %s (exit %s)%s%s%s%s; restarts %lld/%lld\n", id,
            state, dur, exit_s, why[0] ? ": " : "", why, stopped, extra, int_or(s, "restarts", 0),
            int_or(s, "max_restarts", 0));
    json_t *lines = json_object_get(failed, "last_lines");
    if (json_array_size(lines) == 0)
        return;
    fprintf(stderr, "gpusync: the last lines of rank %lld:\n", int_or(failed, "rank", -1));
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l) fprintf(stderr, "  | %s\n", json_string_value(l));
}

void gs_run_end_print(struct gs_cli *cli, const char *id, const char *state, int exit_code,
                      const char *summary)
{
    json_t *s = summary && summary[0] ? json_loads(summary, 0, NULL) : NULL;
    if (!json_is_object(s)) { /* an agent that said nothing more: what the X line said */
        json_decref(s);
        s = json_object();
    }
    if (cli->json) {
        json_t *o = json_pack("{s:i,s:b,s:s,s:s,s:s}", "v", 1, "ok", 1, "event", "ended", "id", id,
                              "state", state);
        json_object_set_new(o, "exit_code", exit_code >= 0 ? json_integer(exit_code) : json_null());
        json_object_del(s, "state");
        json_object_del(s, "exit_code");
        json_object_update(o, s);
        gs_cli_json_print(o);
    } else
        print_text(id, state, exit_code, s);
    json_decref(s);
}
