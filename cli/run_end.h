/* cli/run_end.h: how a run ended, said once when a follow (`run`, `logs -f`) sees its end: one
 * line naming the state, the exit, the failing rank and how it failed (a signal, out of memory),
 * the ranks stopped because of it, restarts used and the duration, then the failing rank's last
 * lines; with --json one "ended" object on stdout instead. Private to cli/. */
#ifndef GS_CLI_RUN_END_H
#define GS_CLI_RUN_END_H

#include "cli/cli.h"

/* Says how run `id` ended: `state` and `exit_code` from the tail's X line (-1: unknown), and
 * `summary`, its JSON object (proto/run.h; "" when the agent sent none). */
void gs_run_end_print(struct gs_cli *cli, const char *id, const char *state, int exit_code,
                      const char *summary);

/* Writes the sentence for the failing rank of a summary ("rank 1 was killed by SIGKILL: out of
 * memory ...") into buf. */
void gs_run_end_failure(json_t *failed, char *buf, size_t cap);

#endif
