/* pgroup: telling a run's process groups from groups that reuse their number. A pgid is only a
 * number: once every process of a group has been reaped, the kernel may hand that number to an
 * unrelated process, and a kill(-pgid) recorded earlier would then reach someone else's group
 * (as root, anyone's). So each rank's group is recorded with its leader's start time, checked
 * before every signal, and once seen empty it is marked gone and never signalled again. Start
 * times have clock-tick resolution (10 ms): a number reused within the tick in which its first
 * holder started would pass the check, which takes a wrap of the whole pid space within that
 * tick. */
#ifndef GA_PGROUP_H
#define GA_PGROUP_H

#include "runs.h"

/* Start time of process pid in clock ticks after boot (/proc/PID/stat field 22), or -1 when
 * there is no such process (or /proc cannot tell). */
long long ga_pgroup_start_ticks(long pid);

/* Records the group led by pid (just forked, already in its own group) in r: pgid and the
 * leader's start time (0 when unknown: then only emptiness is checked). */
void ga_pgroup_record(struct ga_runs_rank *r, long pid);

/* Returns 1 while r's group still holds a process and is the run's own: its leader, if a process
 * of that pid exists, has the recorded start time (a different one means the number was reused).
 * Otherwise marks r->group_gone and returns 0; a group gone stays gone. Zombies count as
 * processes until reaped (they pin the number). */
int ga_pgroup_alive(struct ga_runs_rank *r);

/* Sends sig to r's group if ga_pgroup_alive says it is still the run's. Returns 1 if sent.
 * SIGTERM is followed by SIGCONT: a process stopped by a signal (kill -STOP, Ctrl-Z, a debugger)
 * keeps SIGTERM pending until continued, and would sit out a grace period, its handler never run.
 */
int ga_pgroup_signal(struct ga_runs_rank *r, int sig);

#endif
