// CUDA and cuBLAS failures into pp_status and the backend's sticky error (check.cuh).
#include <stdarg.h>
#include <stdio.h>

#include "common/log.h"
#include "kernels/cuda/cuda-impl.cuh"

static pp_status code_of(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return PP_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return PP_ERR_UNSUPPORTED;
    default:
        return PP_ERR_INTERNAL;
    }
}

pp_status pp__cuda_error(cudaError_t e, const char *call, const char *file, int line)
{
    /* a handled error must not resurface in the next launch check (cudaGetLastError); sticky
     * errors stay in the context whatever this clears */
    cudaGetLastError();
    return pp_error(code_of(e), "%s: %s (%s) at %s:%d", call, cudaGetErrorString(e),
                    cudaGetErrorName(e), file, line);
}

pp_status pp__cublas_error(cublasStatus_t s, const char *call, const char *file, int line)
{
    return pp_error(s == CUBLAS_STATUS_ALLOC_FAILED ? PP_ERR_NOMEM : PP_ERR_INTERNAL,
                    "%s: %s (%s) at %s:%d", call, cublasGetStatusString(s),
                    cublasGetStatusName(s), file, line);
}

// Keeps the first error with its message and logs it once; later ones are dropped (they are
// usually consequences of the first).
static void record(struct pp_cuda *c, pp_status st, const char *msg)
{
    if (c->err != PP_OK)
        return;
    c->err = st;
    snprintf(c->err_msg, sizeof(c->err_msg), "cuda:%d: %s", c->device, msg);
    PP_ERROR("%s", c->err_msg);
}

int pp__cuda_ok(struct pp_cuda *c, cudaError_t e, const char *call, const char *file, int line)
{
    if (e == cudaSuccess)
        return 1;
    pp_status st = pp__cuda_error(e, call, file, line);
    record(c, st, pp_error_detail());
    return 0;
}

int pp__cublas_ok(struct pp_cuda *c, cublasStatus_t s, const char *call, const char *file,
                  int line)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 1;
    pp_status st = pp__cublas_error(s, call, file, line);
    record(c, st, pp_error_detail());
    return 0;
}

int pp__cuda_fail(struct pp_cuda *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    record(c, PP_ERR_UNSUPPORTED, msg);
    return 0;
}
