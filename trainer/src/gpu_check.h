/* gpu_check.h: the CUDA path's check macros. Each wraps one CUDA, cuBLAS or NCCL call and, on
 * failure, fills `err` (a gt_err * in scope) with this rank (`rank`, an int in scope), the file,
 * the line, the call's text and the library's message, then returns -1 from the function, so
 * every GPU failure reaches the user as "rank N: file.cu:123: call: reason". */
#ifndef GT_GPU_CHECK_H
#define GT_GPU_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "gt_err.h"

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return gt_errf(err, "rank %d: %s:%d: %s: %s", rank, __FILE__, __LINE__, #call,         \
                           cudaGetErrorString(e_));                                                \
    } while (0)

/* After a kernel launch: launch-configuration errors surface here, not at the next sync. */
#define KERNEL_CHECK() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return gt_errf(err, "rank %d: %s:%d: %s: cuBLAS status %d (%s)", rank, __FILE__,       \
                           __LINE__, #call, (int)s_, cublasGetStatusString(s_));                   \
    } while (0)

#define NCCL_CHECK(call)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            return gt_errf(err, "rank %d: %s:%d: %s: %s", rank, __FILE__, __LINE__, #call,         \
                           ncclGetErrorString(r_));                                                \
    } while (0)

#endif
