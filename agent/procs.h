/* procs: every process of a run, found and signalled however it left its rank's process group.
 * A rank's child may call setsid(2), or double-fork into a daemon; a process group does not hold
 * those. The supervisor is a child subreaper, so while it lives every such process stays its
 * descendant, and the parent links in /proc find them all. Once the supervisor is gone (killed
 * -9), its orphans belong to init, and two marks remain: the GPUSYNC_RUN_DIR=<run directory> that
 * every rank gets in its environment and its children inherit (the directory, not the id: two
 * nodes of one run may share a machine and an id), and the run's cgroup (v2) where the server
 * lets us make one: a process cannot leave a cgroup by forking, and cgroup.kill ends all of it at
 * once. Signals go through pidfds where the kernel has them, so a pid that was reused between the
 * scan and the signal is never hit. */
#ifndef GA_PROCS_H
#define GA_PROCS_H

#include <limits.h>
#include <stddef.h>

/* One process found. */
struct ga_proc {
    long pid, pgid;
    long long start; /* start time in clock ticks after boot: who this pid is */
    char name[17];   /* the command name, as /proc/PID/comm */
};

struct ga_proclist {
    struct ga_proc *v;
    size_t n, cap;
};

void ga_proclist_release(struct ga_proclist *l);

/* What identifies a run's processes. */
struct ga_procs {
    long supervisor;    /* its descendants are the run's; 0 when gone or not known */
    char dir[PATH_MAX]; /* the run directory, as GPUSYNC_RUN_DIR holds it; "" to skip that mark */
    char id[72];        /* the run id, for the cgroup's name */
    char cgroup[PATH_MAX]; /* the run's cgroup v2 directory; "" when it has none */
};

/* Which processes ga_procs_find returns: the supervisor's descendants (the supervisor itself
 * excluded), and/or those marked as the run's (environment or cgroup). Zombies never count: they
 * hold no memory and are reaped by whoever waits for them. */
enum { GA_PROCS_DESCENDANTS = 1, GA_PROCS_MARKED = 2 };

/* Appends the run's live processes to out. Returns 0, or -1 when /proc cannot be read. */
int ga_procs_find(const struct ga_procs *p, int which, struct ga_proclist *out);

/* Appends every process stopped by a signal or a tracer (/proc/PID/stat state T or t) to out.
 * Returns 0, or -1 when /proc cannot be read. */
int ga_procs_stopped(struct ga_proclist *out);

/* Sends sig to each process of l that is still the one found (same pid and start time), SIGTERM
 * followed by SIGCONT as ga_pgroup_signal does. Returns how many were signalled. */
size_t ga_procs_signal(const struct ga_proclist *l, int sig);

/* Makes a cgroup for the run under the caller's own cgroup v2 (gpusync-run-<id>-<supervisor>) and
 * records it in p->cgroup; leaves p->cgroup empty when the server does not allow it (no cgroup2
 * mount, no permission). Best effort: the other marks still hold. */
void ga_procs_cgroup_make(struct ga_procs *p);

/* Moves the calling process into p's cgroup (in a rank, before exec). Returns 0 or -1. */
int ga_procs_cgroup_enter(const struct ga_procs *p);

/* Kills every process in p's cgroup at once (cgroup.kill, Linux 5.14+). Returns 0, or -1 when
 * there is no cgroup or the kernel cannot. */
int ga_procs_cgroup_kill(const struct ga_procs *p);

/* Removes p's cgroup once it is empty. Returns 0, or -1 (still populated, or none). */
int ga_procs_cgroup_remove(struct ga_procs *p);

/* The number of OOM kills the kernel has counted where it can tell for this run: the run cgroup's
 * memory.events when it has the memory controller, else the whole machine's (/proc/vmstat).
 * Returns -1 when neither can be read; *scope (may be NULL) says which: "cgroup" or "machine". */
long long ga_procs_oom_kills(const struct ga_procs *p, const char **scope);

/* Writes "N processes (pid P name, ...)" for up to `show` of l into buf. */
void ga_proclist_describe(const struct ga_proclist *l, size_t show, char *buf, size_t cap);

#endif
