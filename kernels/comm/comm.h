/* Collective communication among the W workers of one stage (tensor and expert parallelism): one
 * table of function pointers, filled by the CPU implementation (threads of one process over shared
 * memory) and by NCCL (one communicator over the host's GPUs). Every worker calls every collective
 * with its own rank, in the same order; a call returns on a rank once that rank's result is ready.
 * The CPU collectives cannot fail; NCCL's return the library's error (every rank sees one), and the
 * caller must stop using the communicator.
 *
 * Determinism contract: an all-reduce adds the ranks' values in rank order 0, 1, ..., W-1 for every
 * element (CPU), so its bits depend only on the inputs, never on timing or on which thread summed
 * which element. */
#ifndef PP_COMM_H
#define PP_COMM_H

#include <stdint.h>

#include "common/status.h"


#ifdef __cplusplus
extern "C" {
#endif

struct pp_comm;

struct pp_comm_ops {
    /* buf[n] on every rank becomes the element-wise sum of all ranks' buf[n]. */
    pp_status (*all_reduce_sum)(struct pp_comm *c, int rank, float *buf, int64_t n);
    /* recv[n_ranks * n] on every rank receives each rank's send[n], in rank order. send and recv
     * must not overlap. */
    pp_status (*all_gather)(struct pp_comm *c, int rank, const float *send, float *recv,
                            int64_t n);
    /* buf[n] on every rank becomes root's buf[n]. */
    pp_status (*broadcast)(struct pp_comm *c, int rank, float *buf, int64_t n, int root);
    /* Returns once every rank has called it. */
    pp_status (*barrier)(struct pp_comm *c, int rank);
    void (*free)(struct pp_comm *c);
};

struct pp_comm {
    const struct pp_comm_ops *ops;
    const char *name; /* "cpu" or "nccl" */
    int n_ranks;
    /* Bytes each rank contributed to all-reduces and all-gathers since creation, counted by rank 0
     * (the ranks contribute equally). Updated with relaxed atomics: another thread may read them
     * with __atomic_load_n. */
    int64_t bytes_reduced;
    int64_t bytes_gathered;
    void *impl;
};

/* A communicator for n_ranks (1..64) threads of this process. Buffers are plain host memory. The
 * ranks must run concurrently (one thread each): a collective waits for all of them. */
pp_status pp_comm_cpu_new(int n_ranks, struct pp_comm **out);

#ifdef PP_HAVE_NCCL
/* A single-process NCCL communicator over the CUDA devices devices[n_devices] (ncclCommInitAll),
 * rank r on devices[r] with its own stream. Buffers are device memory of the rank's device; each
 * call is complete (stream synchronised) when it returns. */
pp_status pp_comm_nccl_new(int n_devices, const int *devices, struct pp_comm **out);
#endif

/* NULL-safe. */
void pp_comm_free(struct pp_comm *c);

#ifdef __cplusplus
}
#endif

#endif
