/* runlog: `gpusync-agent tail`, which streams a run's rank logs as resumable frames. Frames on
 * stdout (their format: proto/run.h), each written whole and unbuffered: an L frame per chunk of
 * a rank's log, then an X frame once the run has ended and every byte was sent.
 * A frame ends at a line end ('\n' or '\r') unless the line is longer than 64 KiB, or the run
 * has ended, or (with --follow) a partial line has waited 200 ms. */
#ifndef GA_RUNLOG_H
#define GA_RUNLOG_H

/* `gpusync-agent tail --root DIR --id ID [--ranks all|0,1] [--offsets R:OFF,R:OFF] [--follow]`
 * (argv[0] = "tail"; ID may be the run's --name; ranks are global ranks). Without --follow, sends
 * what the logs hold now (and X if the run has ended); with --follow, waits for more (inotify,
 * else 20 ms polling) until the run ends. Returns 0, 1 on errors (unknown run, stdout closed),
 * 2 on bad usage. */
int ga_tail_main(int argc, char **argv);

#endif
