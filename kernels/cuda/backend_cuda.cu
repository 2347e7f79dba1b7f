// The CUDA backend: its state, memory ops and op table (backend_cuda.h). The compute ops live one
// family per file (embed, rmsnorm, rope, elementwise, rows, kv_store, attention, matmul, topk,
// moe_route); weights.cu loads weights; upload.cu carries metadata to the device.
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/kv_store.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rows.cuh"
#include "kernels/cuda/topk.cuh"
#include "kernels/cuda/weights.cuh"

#define STAGE_BYTES ((int64_t)16 << 20)      /* each of the two pinned weight-staging buffers */
#define CUBLAS_WS_MAX ((int64_t)32 << 20)    /* cuBLAS's share of the workspace at most */
#define WORKSPACE_MIN ((int64_t)16 << 20)

int pp__cuda_enter(struct pp_cuda *c)
{
    if (c->err != PP_OK)
        return 0;
    return CUDA_OK(c, cudaSetDevice(c->device));
}

/* The backend's first error, re-raised on the calling thread (the detail names what failed). */
static pp_status sticky(struct pp_cuda *c)
{
    return pp_error(c->err, "%s", c->err_msg);
}

static void cuda_free(struct pp_backend *be)
{
    if (!be)
        return;
    struct pp_cuda *c = (struct pp_cuda *)be->impl;
    if (c) {
        /* errors here are logged (the first one) and otherwise ignored: the backend is going */
        CUDA_OK(c, cudaSetDevice(c->device));
        if (c->stream)
            CUDA_OK(c, cudaStreamSynchronize(c->stream));
        pp__cuda_rings_free(c);
        for (int b = 0; b < 2; b++) {
            if (c->stage[b])
                CUDA_OK(c, cudaFreeHost(c->stage[b]));
            if (c->stage_done[b])
                CUDA_OK(c, cudaEventDestroy(c->stage_done[b]));
        }
        if (c->cublas)
            CUBLAS_OK(c, cublasDestroy(c->cublas));
        if (c->ws)
            CUDA_OK(c, cudaFree(c->ws));
        if (c->stream)
            CUDA_OK(c, cudaStreamDestroy(c->stream));
        pp_free(PP_MEM_MISC, c);
    }
    pp_free(PP_MEM_MISC, be);
}

static pp_status cuda_reserve(struct pp_backend *be, int64_t max_cols, int64_t max_context)
{
    struct pp_cuda *c = pp__cuda(be);
    if (c->err != PP_OK)
        return sticky(c);
    /* a matmul converts at least one row of inputs into the scratch; the rest is chunked */
    if (max_cols * 2 > c->scratch_bytes)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: a %lld-column row does not fit the "
                        "%lld-byte workspace", c->device, (long long)max_cols,
                        (long long)c->scratch_bytes);
    if (max_cols > c->max_cols)
        c->max_cols = max_cols;
    if (max_context > c->max_context)
        c->max_context = max_context;
    return PP_OK;
}

static pp_status cuda_buf_alloc(struct pp_backend *be, enum pp_mem_category cat, int64_t bytes,
                                void **out)
{
    struct pp_cuda *c = pp__cuda(be);
    *out = NULL;
    if (bytes < 0)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: expected a buffer size >= 0, got %lld",
                        c->device, (long long)bytes);
    if (!pp__cuda_enter(c))
        return sticky(c);
    cudaError_t e = cudaMalloc(out, (size_t)(bytes > 256 ? bytes : 256));
    if (e != cudaSuccess) {
        *out = NULL;
        pp__cuda_error(e, "cudaMalloc", __FILE__, __LINE__);
        return pp_error(e == cudaErrorMemoryAllocation ? PP_ERR_NOMEM : PP_ERR_INTERNAL,
                        "cuda:%d: cannot allocate %lld bytes of device memory (%s): %s", c->device,
                        (long long)bytes, pp_mem_category_name(cat), cudaGetErrorString(e));
    }
    return PP_OK;
}

static void cuda_buf_free(struct pp_backend *be, enum pp_mem_category cat, void *p)
{
    (void)cat;
    struct pp_cuda *c = pp__cuda(be);
    if (p && CUDA_OK(c, cudaSetDevice(c->device)))
        CUDA_OK(c, cudaFree(p));
}

static void cuda_copy_in(struct pp_backend *be, void *dst, const void *src, int64_t bytes)
{
    struct pp_cuda *c = pp__cuda(be);
    /* from pageable memory the runtime stages src before returning: the caller may reuse it */
    if (bytes > 0 && pp__cuda_enter(c))
        CUDA_OK(c, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, c->stream));
}

static void cuda_copy(struct pp_backend *be, void *dst, const void *src, int64_t bytes)
{
    struct pp_cuda *c = pp__cuda(be);
    if (bytes > 0 && dst != src && pp__cuda_enter(c))
        CUDA_OK(c, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static void cuda_zero(struct pp_backend *be, void *p, int64_t bytes)
{
    struct pp_cuda *c = pp__cuda(be);
    if (bytes > 0 && pp__cuda_enter(c))
        CUDA_OK(c, cudaMemsetAsync(p, 0, (size_t)bytes, c->stream));
}

static pp_status cuda_sync(struct pp_backend *be)
{
    struct pp_cuda *c = pp__cuda(be);
    if (pp__cuda_enter(c))
        CUDA_OK(c, cudaStreamSynchronize(c->stream));
    return c->err == PP_OK ? PP_OK : sticky(c);
}

static pp_status cuda_copy_out(struct pp_backend *be, void *dst, const void *src, int64_t bytes)
{
    struct pp_cuda *c = pp__cuda(be);
    if (bytes > 0 && pp__cuda_enter(c))
        CUDA_OK(c, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, c->stream));
    return cuda_sync(be);
}

/* Filled by field name (C++17 has no designated initializers), once, before main. */
static struct pp_backend_ops make_ops(void)
{
    struct pp_backend_ops o;
    memset(&o, 0, sizeof(o));
    o.reserve = cuda_reserve;
    o.buf_alloc = cuda_buf_alloc;
    o.buf_free = cuda_buf_free;
    o.copy_in = cuda_copy_in;
    o.zero = cuda_zero;
    o.copy = cuda_copy;
    o.copy_out = cuda_copy_out;
    o.sync = cuda_sync;
    o.weight_load = pp__cuda_weight_load;
    o.weight_free = pp__cuda_weight_free;
    o.vec_load = pp__cuda_vec_load;
    o.vec_free = pp__cuda_vec_free;
    o.matmul = pp__cuda_matmul;
    o.matmul_many = pp__cuda_matmul_many;
    o.rmsnorm = pp__cuda_rmsnorm;
    o.rope = pp__cuda_rope;
    o.kv_store = pp__cuda_kv_store;
    o.attention = pp__cuda_attention;
    o.swiglu = pp__cuda_swiglu;
    o.add = pp__cuda_add;
    o.add_bias = pp__cuda_add_bias;
    o.add_gated = pp__cuda_add_gated;
    o.embed = pp__cuda_embed;
    o.gather_rows = pp__cuda_gather_rows;
    o.scatter_add_rows = pp__cuda_scatter_add_rows;
    o.moe_route = pp__cuda_moe_route;
    o.topk = pp__cuda_topk;
    o.free = cuda_free;
    return o;
}

static const struct pp_backend_ops cuda_ops = make_ops();

/* Everything a backend holds on its device; on error the caller frees what was made. */
static pp_status setup(struct pp_cuda *c, int64_t workspace_bytes)
{
    CUDA_TRY(cudaSetDevice(c->device));
    CUDA_TRY(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->device));
    CUDA_TRY(cudaDeviceGetAttribute(&c->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    c->device));
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_TRY(cublasCreate(&c->cublas));
    CUBLAS_TRY(cublasSetStream(c->cublas, c->stream));
    CUDA_TRY(cudaMalloc(&c->ws, (size_t)workspace_bytes));
    c->ws_bytes = workspace_bytes;
    int64_t cublas_ws = workspace_bytes / 4 < CUBLAS_WS_MAX ? workspace_bytes / 4 : CUBLAS_WS_MAX;
    CUBLAS_TRY(cublasSetWorkspace(c->cublas, c->ws, (size_t)cublas_ws));
    c->scratch = (char *)c->ws + cublas_ws; /* cublas_ws is a multiple of 256 */
    c->scratch_bytes = workspace_bytes - cublas_ws;
    c->stage_bytes = STAGE_BYTES;
    for (int b = 0; b < 2; b++) {
        CUDA_TRY(cudaHostAlloc(&c->stage[b], (size_t)STAGE_BYTES, cudaHostAllocDefault));
        CUDA_TRY(cudaEventCreateWithFlags(&c->stage_done[b], cudaEventDisableTiming));
    }
    pp_status st = pp__cuda_rings_init(c);
    if (st != PP_OK)
        return st;
    if (!pp__cuda_attention_setup(c))
        return sticky(c);
    return PP_OK;
}

extern "C" pp_status pp_backend_cuda_new(int device, int64_t workspace_bytes,
                                         struct pp_backend **out)
{
    *out = NULL;
    if (workspace_bytes == 0)
        workspace_bytes = PP_CUDA_WORKSPACE_DEFAULT;
    if (workspace_bytes < WORKSPACE_MIN)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: expected a workspace of at least %lld bytes, "
                        "got %lld", device, (long long)WORKSPACE_MIN, (long long)workspace_bytes);
    workspace_bytes &= ~(int64_t)1023;
    int count = 0;
    pp_status st = pp_cuda_device_count(&count);
    if (st != PP_OK)
        return pp_error(st, "cuda:%d: %s", device, pp_error_detail());
    if (device < 0 || device >= count)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: this host has %d CUDA device%s", device,
                        count, count == 1 ? "" : "s");
    struct pp_backend *be = (struct pp_backend *)pp_calloc(PP_MEM_MISC, 1, sizeof(*be));
    struct pp_cuda *c = (struct pp_cuda *)pp_calloc(PP_MEM_MISC, 1, sizeof(*c));
    if (!be || !c) {
        pp_free(PP_MEM_MISC, be);
        pp_free(PP_MEM_MISC, c);
        return PP_ERR_NOMEM;
    }
    c->device = device;
    c->err = PP_OK;
    be->ops = &cuda_ops;
    be->name = "cuda";
    be->n_threads = 1;
    be->device = device;
    be->host_memory = 0;
    be->impl = c;
    if ((st = setup(c, workspace_bytes)) != PP_OK) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", pp_error_detail());
        cuda_free(be);
        return pp_error(st, "cuda:%d: %s", device, msg);
    }
    *out = be;
    return PP_OK;
}
