/* Which devices a process computes on: the `devices` setting ("auto" | "cpu" | "cuda:0,1") of the
 * stage daemon and `ppserve run --device`, what it resolves to on this host, and the backends it
 * makes (one per worker: the CPU backend's shards, or one CUDA backend per GPU).
 *
 * "auto" (the default) takes the GPUs when this build has CUDA and the host has enough usable ones
 * for the workers, and otherwise the CPU, with a note that says why no GPU is used. An explicit
 * "cuda:N" never falls back: on a host or build without a usable GPU it is an error naming the
 * problem. */
#ifndef PP_DEVICES_H
#define PP_DEVICES_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

#define PP_DEVICES_MAX 64 /* CUDA devices in one list (the workers' limit) */

enum pp_device_kind {
    PP_DEVICE_AUTO = 0,
    PP_DEVICE_CPU,
    PP_DEVICE_CUDA,
};

struct pp_device_spec {
    enum pp_device_kind kind;
    int n;                    /* PP_DEVICE_CUDA: ids listed */
    int ids[PP_DEVICES_MAX];  /* PP_DEVICE_CUDA: distinct device ids, in the order given */
};

/* Parses "auto", "cpu" or "cuda:N[,N...]" (decimal ids, distinct, no spaces). On error the detail
 * says what was expected and what arrived (without naming a flag or key: callers add that). */
pp_status pp_device_spec_parse(const char *text, struct pp_device_spec *out);

/* pp_device_spec_parse as a configuration check (common/config.h's pp_cfg_key.check). */
pp_status pp_device_spec_check(const char *text);

/* Writes "auto", "cpu" or "cuda:0,1" into buf (truncated to cap). */
void pp_device_spec_format(const struct pp_device_spec *s, char *buf, size_t cap);

/* What want means on this host for n_workers workers: *use is PP_DEVICE_CPU or PP_DEVICE_CUDA with
 * exactly n_workers ids. For "auto", use is the first n_workers GPUs when this build has CUDA and
 * the host has that many usable ones (compute capability 8.0 or newer), otherwise the CPU, and
 * note (cap bytes, may be NULL) says why no GPU is used ("" when GPUs are used). An explicit CUDA
 * list must name n_workers usable devices: otherwise PP_ERR_UNSUPPORTED (no CUDA in this build, no
 * usable device, a device too old) or PP_ERR_INVALID_ARG (an id the host lacks, a list whose
 * length differs from n_workers), with a message that names the device and the problem. */
pp_status pp_devices_resolve(const struct pp_device_spec *want, int n_workers,
                             struct pp_device_spec *use, char *note, size_t cap);

/* Worker r's device on the resolved devices use, as the stage registers it: its name ("cpu:r",
 * "cuda:N") and, for a GPU, its memory in *memory_bytes (0 when the CUDA query fails); for the CPU
 * *memory_bytes is -1 (the caller splits the host's memory). */
void pp_devices_describe(const struct pp_device_spec *use, int r, char *name, size_t cap,
                         int64_t *memory_bytes);

/* One backend per worker on the resolved devices use: the CPU backend's shards sharing n_threads
 * threads (pp_backend_cpu_new_workers), or one CUDA backend per listed GPU. out[n_workers] is
 * freed with pp_backend_free_all; on error nothing is left allocated. */
pp_status pp_backends_new(const struct pp_device_spec *use, int n_threads, int n_workers,
                          struct pp_backend **out);

#endif
