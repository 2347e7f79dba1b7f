// Collectives over NCCL: one communicator per device from ncclCommInitAll, each rank's calls on its
// own stream from its own worker thread. Every CUDA and NCCL call is checked; a failure becomes a
// pp_status naming the call and the library's error text.
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/alloc.h"
#include "kernels/comm/comm.h"

#define MAX_DEVICES 64

struct nccl_comm {
    int n;
    int devices[MAX_DEVICES];
    ncclComm_t comms[MAX_DEVICES];
    cudaStream_t streams[MAX_DEVICES];
};

#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return pp_error(PP_ERR_INTERNAL, "%s: %s", #call, cudaGetErrorString(e_));             \
    } while (0)

#define NCCL_TRY(call)                                                                             \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            return pp_error(PP_ERR_INTERNAL, "%s: %s", #call, ncclGetErrorString(r_));             \
    } while (0)

static struct nccl_comm *impl(struct pp_comm *pc)
{
    return (struct nccl_comm *)pc->impl;
}

static pp_status finish(struct nccl_comm *c, int rank)
{
    CUDA_TRY(cudaStreamSynchronize(c->streams[rank]));
    return PP_OK;
}

static pp_status nccl_all_reduce_sum(struct pp_comm *pc, int rank, float *buf, int64_t n)
{
    struct nccl_comm *c = impl(pc);
    if (rank == 0)
        __atomic_fetch_add(&pc->bytes_reduced, n * (int64_t)sizeof(float), __ATOMIC_RELAXED);
    CUDA_TRY(cudaSetDevice(c->devices[rank]));
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, c->comms[rank],
                           c->streams[rank]));
    return finish(c, rank);
}

static pp_status nccl_all_gather(struct pp_comm *pc, int rank, const float *send, float *recv,
                                 int64_t n)
{
    struct nccl_comm *c = impl(pc);
    if (rank == 0)
        __atomic_fetch_add(&pc->bytes_gathered, n * (int64_t)sizeof(float), __ATOMIC_RELAXED);
    CUDA_TRY(cudaSetDevice(c->devices[rank]));
    NCCL_TRY(ncclAllGather(send, recv, (size_t)n, ncclFloat32, c->comms[rank], c->streams[rank]));
    return finish(c, rank);
}

static pp_status nccl_broadcast(struct pp_comm *pc, int rank, float *buf, int64_t n, int root)
{
    struct nccl_comm *c = impl(pc);
    CUDA_TRY(cudaSetDevice(c->devices[rank]));
    NCCL_TRY(ncclBroadcast(buf, buf, (size_t)n, ncclFloat32, root, c->comms[rank],
                           c->streams[rank]));
    return finish(c, rank);
}

/* An all-reduce of one float: NCCL has no barrier of its own. */
static pp_status nccl_barrier(struct pp_comm *pc, int rank)
{
    struct nccl_comm *c = impl(pc);
    CUDA_TRY(cudaSetDevice(c->devices[rank]));
    float *one = NULL;
    CUDA_TRY(cudaMallocAsync((void **)&one, sizeof(float), c->streams[rank]));
    ncclResult_t r = ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, c->comms[rank],
                                   c->streams[rank]);
    cudaFreeAsync(one, c->streams[rank]);
    if (r != ncclSuccess)
        return pp_error(PP_ERR_INTERNAL, "ncclAllReduce (barrier): %s", ncclGetErrorString(r));
    return finish(c, rank);
}

static void nccl_free(struct pp_comm *pc)
{
    struct nccl_comm *c = impl(pc);
    if (c) {
        for (int r = 0; r < c->n; r++) {
            if (c->streams[r]) {
                cudaSetDevice(c->devices[r]);
                cudaStreamDestroy(c->streams[r]);
            }
            if (c->comms[r])
                ncclCommDestroy(c->comms[r]);
        }
        pp_free(PP_MEM_MISC, c);
    }
    pp_free(PP_MEM_MISC, pc);
}

static const struct pp_comm_ops nccl_ops = {
    nccl_all_reduce_sum, nccl_all_gather, nccl_broadcast, nccl_barrier, nccl_free,
};

extern "C" pp_status pp_comm_nccl_new(int n_devices, const int *devices, struct pp_comm **out)
{
    if (n_devices < 1 || n_devices > MAX_DEVICES)
        return pp_error(PP_ERR_INVALID_ARG, "nccl: expected 1..%d devices, got %d", MAX_DEVICES,
                        n_devices);
    int have = 0;
    cudaError_t e = cudaGetDeviceCount(&have);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return pp_error(PP_ERR_UNSUPPORTED, "nccl: no usable CUDA device: %s",
                        cudaGetErrorString(e));
    }
    for (int r = 0; r < n_devices; r++)
        if (devices[r] < 0 || devices[r] >= have)
            return pp_error(PP_ERR_INVALID_ARG, "nccl: device cuda:%d does not exist (%d present)",
                            devices[r], have);
    struct pp_comm *pc = (struct pp_comm *)pp_calloc(PP_MEM_MISC, 1, sizeof(*pc));
    struct nccl_comm *c = (struct nccl_comm *)pp_calloc(PP_MEM_MISC, 1, sizeof(*c));
    if (!pc || !c) {
        pp_free(PP_MEM_MISC, pc);
        pp_free(PP_MEM_MISC, c);
        return PP_ERR_NOMEM;
    }
    pc->ops = &nccl_ops;
    pc->name = "nccl";
    pc->n_ranks = n_devices;
    pc->impl = c;
    c->n = n_devices;
    for (int r = 0; r < n_devices; r++)
        c->devices[r] = devices[r];
    ncclResult_t nr = ncclCommInitAll(c->comms, n_devices, devices);
    if (nr != ncclSuccess) {
        for (int r = 0; r < n_devices; r++)
            c->comms[r] = NULL;
        nccl_free(pc);
        return pp_error(PP_ERR_UNSUPPORTED, "ncclCommInitAll over %d devices: %s", n_devices,
                        ncclGetErrorString(nr));
    }
    for (int r = 0; r < n_devices; r++) {
        cudaError_t se = cudaSetDevice(devices[r]);
        if (se == cudaSuccess)
            se = cudaStreamCreateWithFlags(&c->streams[r], cudaStreamNonBlocking);
        if (se != cudaSuccess) {
            nccl_free(pc);
            return pp_error(PP_ERR_UNSUPPORTED, "nccl: stream on cuda:%d: %s", devices[r],
                            cudaGetErrorString(se));
        }
    }
    *out = pc;
    return PP_OK;
}
