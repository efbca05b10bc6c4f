/* dist.h: process-group setup and host collectives for CPU ranks. Rank 0 hosts a rendezvous on
 * the master port; every rank reports a ring listener there, gets the table back, and links to
 * its ring neighbours. Collectives (sum all-reduce, broadcast from rank 0) then run over that TCP
 * ring with a timeout on every wait, so a dead or stuck peer becomes an error, never a hang.
 * IPv4 only; all ranks must share the host's byte order (floats travel raw). */
#ifndef GT_DIST_H
#define GT_DIST_H

#include <stddef.h>

#include "gt_err.h"

#define GT_DIST_HOST_MAX 256

typedef struct gt_dist_config {
    int rank, world, local_rank;
    char host[GT_DIST_HOST_MAX]; /* master address */
    int port;                    /* master port */
    int rdzv_timeout_s;          /* how long non-zero ranks retry, and rank 0 waits for them */
    int timeout_s;               /* bound on each collective's wait for a peer */
    const char *source;          /* "torchrun env", "slurm env", "flags" or "single process" */
    int restart; /* TORCHELASTIC_RESTART_COUNT: 0 first attempt, N after N restarts */
} gt_dist_config;

typedef struct gt_dist {
    int rank, world, local_rank;
    int next_fd, prev_fd; /* ring sockets, -1 when world == 1 */
    int timeout_ms;
    void *scratch; /* receive buffer for the reduce-scatter, owned */
    size_t scratch_len;
} gt_dist;

/* Fills c from RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT (torchrun), else
 * SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (+ MASTER_ADDR or SLURM_LAUNCH_NODE_IPADDR), else a
 * single process; TORCHELASTIC_RESTART_COUNT (torchrun, gpusync run) gives the restart count
 * whatever the source. Fails on a malformed number. Defaults: 127.0.0.1:29500, timeouts 60 s / 300
 * s. */
int gt_dist_config_from_env(gt_dist_config *c, gt_err *err);

/* Parses "tcp://HOST:PORT" (or "HOST:PORT") into c->host and c->port. */
int gt_dist_parse_master(gt_dist_config *c, const char *url, gt_err *err);

/* Connects the process group. On failure (bind error, rendezvous timeout, rank clash, world
 * mismatch) returns -1 with a message naming this rank; *d holds no sockets afterwards. */
int gt_dist_init(gt_dist *d, const gt_dist_config *c, gt_err *err);
void gt_dist_release(gt_dist *d);

/* In-place sum over all ranks; every rank ends with identical bytes (a fixed ring order). */
int gt_dist_allreduce_f32(gt_dist *d, float *buf, size_t n, gt_err *err);
int gt_dist_allreduce_f64(gt_dist *d, double *buf, size_t n, gt_err *err);
/* Copies rank 0's n bytes of buf to every rank. */
int gt_dist_broadcast(gt_dist *d, void *buf, size_t n, gt_err *err);

#endif
