/* CUDA device discovery. Built only with the CUDA toolkit (PP_HAVE_CUDA); a binary that links it
 * still starts on a host without a GPU or driver: the probe reports why none is usable. */
#ifndef PP_CUDA_DEVICE_H
#define PP_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct pp_cuda_device_info {
    char name[128];
    int major;
    int minor;
    int64_t memory_bytes;
    int multiprocessors;
};

/* Number of usable CUDA devices in *count. On a host without a driver or GPU, returns
 * PP_ERR_UNSUPPORTED with a message that says why (the CUDA error text), and *count = 0. */
pp_status pp_cuda_device_count(int *count);
pp_status pp_cuda_device_query(int device, struct pp_cuda_device_info *out);

#ifdef __cplusplus
}
#endif

#endif
