/* pgroup: a run's process groups, identified across pid reuse (see pgroup.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "pgroup.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

long long ga_pgroup_start_ticks(long pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *fp = fopen(path, "re");
    if (!fp)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    /* the command name (field 2) may hold spaces and parentheses: count from the last ')' */
    const char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    long long ticks;
    return p && sscanf(p + 1, "%lld", &ticks) == 1 ? ticks : -1;
}

void ga_pgroup_record(struct ga_runs_rank *r, long pid)
{
    long long start = ga_pgroup_start_ticks(pid);
    r->pid = r->pgid = pid;
    r->pgid_start = start > 0 ? start : 0;
    r->group_gone = 0;
}

/* 1 if the leader's pid now belongs to a process other than the recorded leader. */
static int number_reused(const struct ga_runs_rank *r)
{
    long long now = ga_pgroup_start_ticks(r->pgid);
    return r->pgid_start > 0 && now >= 0 && now != r->pgid_start;
}

int ga_pgroup_alive(struct ga_runs_rank *r)
{
    if (r->group_gone || r->pgid <= 1)
        return 0;
    /* While the leader (alive or a zombie) holds its pid, no other group can take the number;
     * once it is reaped, the group keeps the number only while a member lives, so a group seen
     * empty here can come back only as someone else's. */
    if (number_reused(r) || (kill((pid_t)-r->pgid, 0) < 0 && errno == ESRCH)) {
        r->group_gone = 1;
        return 0;
    }
    return 1;
}

int ga_pgroup_signal(struct ga_runs_rank *r, int sig)
{
    int sent = ga_pgroup_alive(r) && kill((pid_t)-r->pgid, sig) == 0;
    if (sent && sig == SIGTERM) /* a stopped process acts on it only once continued */
        kill((pid_t)-r->pgid, SIGCONT);
    return sent;
}
