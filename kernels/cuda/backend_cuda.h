/* The CUDA backend: struct pp_backend_ops on one NVIDIA GPU (sm_80 and newer). Activations, the KV
 * pool and weights live in device memory; ops are queued on the backend's own stream and run
 * asynchronously, so their errors surface at the next sync or copy_out (kernels/backend.h).
 *
 * Numerics: weights are kept in the checkpoint's 16-bit type (bf16, f16); f32 and Q8_0 weights are
 * converted to bf16 when loaded. Matmuls accumulate in f32: up to PP_CUDA_GEMV_MAX_ROWS tokens by
 * our own kernel on f32 activations, more through cuBLAS on activations rounded to the weight's
 * 16-bit type. Everything else (norms, RoPE with angles in double, attention, softmax) is f32.
 * Results differ from the CPU backend's by rounding and reduction order only; the op tests
 * (tests/gpu) hold them to per-op tolerances.
 *
 * Not thread-safe: one thread drives a backend at a time (any thread; each op selects the device).
 */
#ifndef PP_BACKEND_CUDA_H
#define PP_BACKEND_CUDA_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default device workspace: cuBLAS's workspace, 16-bit copies of matmul inputs, attention
 * partials. Larger calls run in pieces that fit. */
#define PP_CUDA_WORKSPACE_DEFAULT ((int64_t)256 << 20)

/* Matmuls of up to this many tokens run in the f32-activation GEMV kernel (decode); more go to
 * cuBLAS. */
#define PP_CUDA_GEMV_MAX_ROWS 4

/* A weight of at most this many rows (an MoE router: one row per expert) runs in the GEMV kernel
 * for any number of tokens: its f32 activations keep the router's logits as close to the CPU's as
 * the decode path's, so a near tie between experts is not decided by 16-bit rounding. */
#define PP_CUDA_GEMV_ALWAYS_ROWS 256

/* Whether a matmul of n tokens over a weight of `rows` rows takes the GEMV kernel. */
#define PP_CUDA_USES_GEMV(n, rows)                                                                 \
    ((n) <= PP_CUDA_GEMV_MAX_ROWS || (rows) <= PP_CUDA_GEMV_ALWAYS_ROWS)

/* Attention: sequence parts of up to PP_CUDA_ATTN_DECODE_TOKENS tokens take the f32
 * flash-decoding kernel (when at most PP_CUDA_ATTN_DECODE_MAX_G query heads share a KV head);
 * longer parts with head_dim 64 or 128 take the tensor cores (f16 inputs, f32 accumulation and
 * softmax), other head dims an f32 kernel. */
#define PP_CUDA_ATTN_DECODE_TOKENS 8
#define PP_CUDA_ATTN_DECODE_MAX_G 16
#define PP_CUDA_ATTN_TENSOR_CORES(head_dim) ((head_dim) == 64 || (head_dim) == 128)

/* A backend on CUDA device `device` with a workspace of workspace_bytes (0: the default; at least
 * 16 MiB). Fails with the CUDA error text when the device cannot be used. *out is freed with
 * be->ops->free(be). */
pp_status pp_backend_cuda_new(int device, int64_t workspace_bytes, struct pp_backend **out);

/* Fills n elements of dtype t (f32, f16 or bf16) at dst (this backend's memory) with uniform
 * values in [-scale, scale) from a counter-based hash of (seed, index): the same values on every
 * device. For benchmarks that generate weights on the device. Queued like an op. */
void pp_cuda_fill_uniform(struct pp_backend *be, void *dst, enum pp_dtype t, int64_t n,
                          uint64_t seed, float scale);

/* Queues a kernel that holds the backend's stream for `microseconds` (benchmarks: ops queued
 * behind it run back to back, so a step's time minus the delay is its GPU time without gaps where
 * the GPU waited for the host). */
void pp_cuda_delay(struct pp_backend *be, int64_t microseconds);

#ifdef __cplusplus
}
#endif

#endif
