// The one place where CUDA and cuBLAS results are checked. Functions that return a pp_status use
// CUDA_TRY / CUBLAS_TRY (the error becomes the status, with the call, the library's text and
// where). The backend's void ops use CUDA_OK / CUBLAS_OK / LAUNCH_OK, which record the first error
// in the backend (reported by the next sync or copy_out) and return 0, so an op can stop at once.
#ifndef PP_CUDA_CHECK_CUH
#define PP_CUDA_CHECK_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/status.h"

struct pp_cuda;

// The status for a failed call: PP_ERR_NOMEM for an allocation, PP_ERR_UNSUPPORTED when no device
// can be used, PP_ERR_INTERNAL otherwise; the detail names the call, the error and the place.
pp_status pp__cuda_error(cudaError_t e, const char *call, const char *file, int line);
pp_status pp__cublas_error(cublasStatus_t s, const char *call, const char *file, int line);

// Records a failure in c (the first one wins, and is logged); returns 1 when e is success.
int pp__cuda_ok(struct pp_cuda *c, cudaError_t e, const char *call, const char *file, int line);
int pp__cublas_ok(struct pp_cuda *c, cublasStatus_t s, const char *call, const char *file,
                  int line);
// Records an error of our own (a shape or dtype the backend cannot run); returns 0.
int pp__cuda_fail(struct pp_cuda *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return pp__cuda_error(e_, #call, __FILE__, __LINE__);                                  \
    } while (0)

#define CUBLAS_TRY(call)                                                                           \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return pp__cublas_error(s_, #call, __FILE__, __LINE__);                                \
    } while (0)

#define CUDA_OK(c, call) pp__cuda_ok((c), (call), #call, __FILE__, __LINE__)
#define CUBLAS_OK(c, call) pp__cublas_ok((c), (call), #call, __FILE__, __LINE__)
// After a <<<...>>> launch: a bad configuration shows up here at once; faults while the kernel
// runs show up at the next sync.
#define LAUNCH_OK(c, kernel)                                                                       \
    pp__cuda_ok((c), cudaGetLastError(), "launch " kernel, __FILE__, __LINE__)

#endif
