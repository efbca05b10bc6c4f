/* nccl_comm.h: the one place NCCL is used. A communicator per rank, created from a unique id
 * that rank 0 makes and the TCP process group (dist.h) broadcasts, with a stream of its own:
 * gradient averaging waits on an event recorded on the compute stream, runs on the NCCL stream,
 * and the compute stream waits on its completion event, as llm.c's multi-GPU path does.
 * Functions return 0, or -1 with a message naming the rank, file and line. Built only with CUDA. */
#ifndef GT_NCCL_COMM_H
#define GT_NCCL_COMM_H

#include <stddef.h>

#include <cuda_runtime.h>

#include "dist.h"
#include "gt_err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_nccl gt_nccl;

/* Collective over all ranks of dist: must be called by every rank, after cudaSetDevice. On
 * failure *out is NULL. The caller owns the result (gt_nccl_free). */
int gt_nccl_init(gt_nccl **out, gt_dist *dist, gt_err *err);
void gt_nccl_free(gt_nccl *c);

/* Averages n floats of device buffer buf over all ranks (ncclAvg), ordered after the work
 * already queued on `compute`; work queued on `compute` afterwards sees the result. Blocks
 * while too many earlier reductions are unfinished, and fails (the communicator is then
 * aborted and every later call fails) when one does not finish within dist's --timeout. */
int gt_nccl_allreduce_avg(gt_nccl *c, float *buf, size_t n, cudaStream_t compute, gt_err *err);

/* Waits (with the same watchdog) until every queued reduction has finished; call it before a
 * host synchronisation so a lost peer is an error, not a hang. */
int gt_nccl_drain(gt_nccl *c, gt_err *err);

/* Test helper: copies host[0..n) to the device, averages it over ranks, copies it back. */
int gt_nccl_allreduce_avg_host(gt_nccl *c, float *host, size_t n, gt_err *err);

#ifdef __cplusplus
}
#endif

#endif
