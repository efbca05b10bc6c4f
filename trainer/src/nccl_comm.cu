/* nccl_comm.cu: see nccl_comm.h. The id travels over the trainer's own TCP ring (no extra
 * rendezvous), and the reduction stream is created non-blocking so it never serialises with
 * the legacy default stream.
 * Watchdog: NCCL kernels spin forever when a peer dies, and the host would then block inside
 * a later kernel launch once the launch queue fills. So at most GT_NCCL_INFLIGHT reductions
 * are queued: before queueing another, the host polls the completion event of the one that
 * many calls back, checking ncclCommGetAsyncError, and aborts the communicator with an error
 * naming the rank when the peer's (--timeout) time runs out. */
extern "C" {
#include "dist.h"
#include "gt_err.h"
}
#include "gpu_check.h"
#include "nccl_comm.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GT_NCCL_INFLIGHT 8

struct gt_nccl {
    int rank, world, timeout_ms;
    ncclComm_t comm;
    cudaStream_t stream;                /* NCCL's own stream */
    cudaEvent_t ready;                  /* on the compute stream: gradients are complete */
    cudaEvent_t done[GT_NCCL_INFLIGHT]; /* on the NCCL stream: reduction k is complete */
    long long calls;                    /* reductions queued so far */
};

static int create(gt_nccl *c, gt_dist *dist, gt_err *err)
{
    int rank = c->rank;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (rank == 0)
        NCCL_CHECK(ncclGetUniqueId(&id));
    if (gt_dist_broadcast(dist, &id, sizeof(id), err) != 0)
        return -1;
    /* Every rank has the id and got this far: a rank that failed earlier makes this fail
     * (its socket closes) instead of leaving the others in NCCL's bootstrap forever. */
    float ready = 1.0f;
    if (gt_dist_allreduce_f32(dist, &ready, 1, err) != 0)
        return -1;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
    for (int i = 0; i < GT_NCCL_INFLIGHT; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c->done[i], cudaEventDisableTiming));
    NCCL_CHECK(ncclCommInitRank(&c->comm, c->world, id, rank));
    return 0;
}

int gt_nccl_init(gt_nccl **out, gt_dist *dist, gt_err *err)
{
    *out = NULL;
    gt_nccl *c = (gt_nccl *)calloc(1, sizeof(*c));
    if (!c)
        return gt_errf(err, "rank %d: out of memory", dist->rank);
    c->rank = dist->rank;
    c->world = dist->world;
    c->timeout_ms = dist->timeout_ms > 0 ? dist->timeout_ms : 300000;
    if (create(c, dist, err) != 0) {
        gt_nccl_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void gt_nccl_free(gt_nccl *c)
{
    if (!c)
        return;
    if (c->comm)
        ncclCommDestroy(c->comm);
    if (c->ready)
        cudaEventDestroy(c->ready);
    for (int i = 0; i < GT_NCCL_INFLIGHT; i++)
        if (c->done[i])
            cudaEventDestroy(c->done[i]);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Polls ev until it completes; fails (aborting the communicator) on an NCCL async error or
 * when timeout_ms pass. */
static int wait_event(gt_nccl *c, cudaEvent_t ev, gt_err *err)
{
    int rank = c->rank;
    double deadline = now_ms() + c->timeout_ms;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            CUDA_CHECK(e);
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(c->comm, &async));
        if (async != ncclSuccess || now_ms() > deadline) {
            ncclCommAbort(c->comm);
            c->comm = NULL;
            return gt_errf(err, "rank %d: NCCL all-reduce %s (a peer rank probably failed)", rank,
                           async != ncclSuccess ? ncclGetErrorString(async)
                                                : "did not complete within --timeout");
        }
        struct timespec ts = {0, 200 * 1000}; /* 0.2 ms between polls of a running kernel */
        nanosleep(&ts, NULL);
    }
}

int gt_nccl_allreduce_avg(gt_nccl *c, float *buf, size_t n, cudaStream_t compute, gt_err *err)
{
    int rank = c->rank;
    if (!c->comm)
        return gt_errf(err, "rank %d: NCCL communicator was aborted", rank);
    cudaEvent_t done = c->done[c->calls % GT_NCCL_INFLIGHT];
    if (c->calls >= GT_NCCL_INFLIGHT && wait_event(c, done, err) != 0)
        return -1;
    CUDA_CHECK(cudaEventRecord(c->ready, compute));
    CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->ready, 0));
    NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclAvg, c->comm, c->stream));
    CUDA_CHECK(cudaEventRecord(done, c->stream));
    CUDA_CHECK(cudaStreamWaitEvent(compute, done, 0));
    c->calls++;
    return 0;
}

int gt_nccl_drain(gt_nccl *c, gt_err *err)
{
    if (!c->comm)
        return gt_errf(err, "rank %d: NCCL communicator was aborted", c->rank);
    return c->calls == 0 ? 0 : wait_event(c, c->done[(c->calls - 1) % GT_NCCL_INFLIGHT], err);
}

int gt_nccl_allreduce_avg_host(gt_nccl *c, float *host, size_t n, gt_err *err)
{
    int rank = c->rank;
    float *dev = NULL;
    CUDA_CHECK(cudaMalloc(&dev, n * sizeof(float)));
    int rc = -1;
    cudaError_t e = cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess && gt_nccl_allreduce_avg(c, dev, n, 0, err) == 0) {
        rc = gt_nccl_drain(c, err);
        e = rc == 0 ? cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost)
                    : cudaSuccess;
        rc = rc == 0 && e == cudaSuccess ? 0 : -1;
    }
    if (e != cudaSuccess)
        rc = gt_errf(err, "rank %d: %s:%d: cudaMemcpy: %s", rank, __FILE__, __LINE__,
                     cudaGetErrorString(e));
    cudaFree(dev);
    return rc;
}
