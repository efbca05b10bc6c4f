/* sample: `gpusync-agent sample`, the server side of `gpusync top`. One process streams one JSON
 * line per interval: CPU, memory, disks and network from /proc deltas (as iostat and ifstat
 * compute them), GPUs from one nvidia-smi query per interval, and the newest running run of the
 * project with its ranks and the bundled trainer's samples/s. The client reads the lines over a
 * single exec channel; the sampler exits when that channel closes. */
#ifndef GA_SAMPLE_H
#define GA_SAMPLE_H

/* `gpusync-agent sample [--root DIR] [--interval-ms N] [--count N]` (argv[0] = "sample").
 *
 * Prints one line per interval on stdout, the first after one interval (rates need two
 * readings), until --count lines are out (0 or none: forever) or stdout closes (the client
 * left: its pipe reports POLLHUP/POLLERR, or a write fails). Each line is an object:
 *   time      ISO-8601 UTC; interval_ms, the milliseconds the rates cover
 *   cpu       {cores, load1, load5, load15, util_pct, iowait_pct} (/proc/loadavg, /proc/stat)
 *   memory    {total_mib, used_mib, available_mib} (/proc/meminfo; used = total - available)
 *   disks     [{name, read_mb_s, write_mb_s}] whole disks of /proc/diskstats, MB = 2^20 bytes
 *             as `iostat -m` counts them; loop, ram and zram devices and partitions skipped
 *   net       [{name, rx_mb_s, tx_mb_s}] /proc/net/dev, lo skipped
 *   gpus      [{index, name, util_pct, mem_used_mib, mem_total_mib, power_w, temp_c}] from
 *             nvidia-smi (a field it reports as N/A is null); gpu_error: null, or why the list
 *             is empty (no nvidia-smi on PATH, it failed, it timed out)
 *   run       null, or the newest run under DIR/.gpusync/runs whose supervisor is alive:
 *             {id, state, ranks: [{rank, pid, state, exit_code}], samples_per_s} where
 *             samples_per_s is the last "N samples/s" of rank 0's log (the bundled trainer
 *             prints one per epoch) or null.
 * Returns the exit status: 0 (count reached or client gone), 2 on bad usage. */
int ga_sample_main(int argc, char **argv);

#endif
