/* Device selection: resolving a device spec (parsed in kernels/device_spec.c) on this host, and
 * making the workers' backends. CUDA is queried only in builds that have it (PP_HAVE_CUDA); a host
 * without a driver or GPU answers with the CUDA error text, which becomes the note or the error. */
#include "kernels/devices.h"

#include <stdio.h>
#include <string.h>

#ifdef PP_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#endif

#define MIN_SM 80 /* the oldest architecture this build has kernels for (CMake: sm_80, sm_90) */

static void set_note(char *note, size_t cap, const char *text)
{
    if (note && cap > 0)
        snprintf(note, cap, "%s", text);
}

#ifdef PP_HAVE_CUDA
/* Checks that device id exists among count and has kernels in this build. */
static pp_status check_device(int id, int count)
{
    if (id >= count)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: this host has %d CUDA device%s (cuda:0..%d)",
                        id, count, count == 1 ? "" : "s", count - 1);
    struct pp_cuda_device_info info;
    pp_status st = pp_cuda_device_query(id, &info);
    if (st != PP_OK)
        return st;
    if (info.major * 10 + info.minor < MIN_SM)
        return pp_error(PP_ERR_UNSUPPORTED, "cuda:%d (%s) is sm_%d%d: this build has kernels for "
                        "sm_80 and newer only", id, info.name, info.major, info.minor);
    return PP_OK;
}
#endif

pp_status pp_devices_resolve(const struct pp_device_spec *want, int n_workers,
                             struct pp_device_spec *use, char *note, size_t cap)
{
    memset(use, 0, sizeof(*use));
    set_note(note, cap, "");
    if (n_workers < 1 || n_workers > PP_DEVICES_MAX)
        return pp_error(PP_ERR_INVALID_ARG, "devices: expected 1..%d workers, got %d",
                        PP_DEVICES_MAX, n_workers);
    if (want->kind == PP_DEVICE_CPU) {
        use->kind = PP_DEVICE_CPU;
        return PP_OK;
    }
    char listed[16 * PP_DEVICES_MAX];
    pp_device_spec_format(want, listed, sizeof(listed));
    if (want->kind == PP_DEVICE_CUDA && want->n != n_workers)
        return pp_error(PP_ERR_INVALID_ARG, "%s lists %d device%s for %d worker%s: expected "
                        "one device per worker", listed, want->n, want->n == 1 ? "" : "s",
                        n_workers, n_workers == 1 ? "" : "s");
#ifndef PP_HAVE_CUDA
    if (want->kind == PP_DEVICE_CUDA)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: this build has no CUDA support (build with the "
                        "CUDA toolkit and PP_CUDA=ON), so no GPU can be used", listed);
    use->kind = PP_DEVICE_CPU;
    set_note(note, cap, "this build has no CUDA support");
    return PP_OK;
#else
    int count = 0;
    pp_status st = pp_cuda_device_count(&count);
    if (want->kind == PP_DEVICE_CUDA) {
        if (st != PP_OK)
            return pp_error(st, "%s: %s", listed, pp_error_detail());
        for (int i = 0; i < want->n; i++)
            if ((st = check_device(want->ids[i], count)) != PP_OK)
                return st;
        *use = *want;
        return PP_OK;
    }
    /* auto: the first n_workers GPUs when they are there and usable, else the CPU */
    use->kind = PP_DEVICE_CPU;
    if (st != PP_OK) {
        set_note(note, cap, pp_error_detail());
        return PP_OK;
    }
    if (count < n_workers) {
        char why[128];
        snprintf(why, sizeof(why), "%d CUDA device%s for %d worker%s", count,
                 count == 1 ? "" : "s", n_workers, n_workers == 1 ? "" : "s");
        set_note(note, cap, why);
        return PP_OK;
    }
    for (int i = 0; i < n_workers; i++)
        if (check_device(i, count) != PP_OK) {
            set_note(note, cap, pp_error_detail());
            return PP_OK;
        }
    use->kind = PP_DEVICE_CUDA;
    use->n = n_workers;
    for (int i = 0; i < n_workers; i++)
        use->ids[i] = i;
    return PP_OK;
#endif
}

void pp_devices_describe(const struct pp_device_spec *use, int r, char *name, size_t cap,
                         int64_t *memory_bytes)
{
    *memory_bytes = -1;
    if (use->kind != PP_DEVICE_CUDA || r < 0 || r >= use->n) {
        snprintf(name, cap, "cpu:%d", r);
        return;
    }
    snprintf(name, cap, "cuda:%d", use->ids[r]);
    *memory_bytes = 0;
#ifdef PP_HAVE_CUDA
    struct pp_cuda_device_info info;
    if (pp_cuda_device_query(use->ids[r], &info) == PP_OK)
        *memory_bytes = info.memory_bytes;
#endif
}

pp_status pp_backends_new(const struct pp_device_spec *use, int n_threads, int n_workers,
                          struct pp_backend **out)
{
    if (use->kind == PP_DEVICE_CPU)
        return pp_backend_cpu_new_workers(n_threads, n_workers, out);
    if (use->kind != PP_DEVICE_CUDA || use->n != n_workers)
        return pp_error(PP_ERR_INVALID_ARG, "backends: expected resolved devices for %d workers "
                        "(cpu, or %d CUDA devices)", n_workers, n_workers);
    for (int r = 0; r < n_workers; r++)
        out[r] = NULL;
#ifdef PP_HAVE_CUDA
    for (int r = 0; r < n_workers; r++) {
        pp_status st = pp_backend_cuda_new(use->ids[r], 0, &out[r]);
        if (st != PP_OK) {
            pp_backend_free_all(out, n_workers);
            return st;
        }
    }
    return PP_OK;
#else
    return pp_error(PP_ERR_UNSUPPORTED, "cuda:%d: this build has no CUDA support", use->ids[0]);
#endif
}
