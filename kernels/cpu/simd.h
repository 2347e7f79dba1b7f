/* Vector versions of the CPU backend's inner loops, chosen once at run time from the CPU's features.
 * Each computes exactly what its portable C counterpart computes, bit for bit: the dot products keep
 * the eight-lane order of pp__dot (multiply, round, add, round — never a fused multiply-add), and
 * the conversions are exact. So results never depend on which path a machine takes. */
#ifndef PP_SIMD_H
#define PP_SIMD_H

#include <stdint.h>

#include "kernels/dtype.h"

/* y[t] = pp__dot(w, x + t*ld, n) for t in [0, nt). */
typedef void (*pp_dot_rows_fn)(float *y, const float *w, const float *x, int64_t ld, int64_t n,
                               int64_t nt);
/* pp_row_to_f32 for f16/bf16 (other dtypes use the portable function). */
typedef void (*pp_convert_fn)(float *dst, const void *src, int64_t n);

struct pp_simd {
    const char *name; /* "avx2" or "portable" */
    pp_dot_rows_fn dot_rows;
    pp_convert_fn f16_to_f32;
    pp_convert_fn bf16_to_f32;
};

/* The best implementation for this CPU (PP_SIMD=portable in the environment forces the portable
 * one, which tests use to prove both agree). Thread-safe; the table is immutable. */
const struct pp_simd *pp_simd_get(void);
const struct pp_simd *pp_simd_portable(void);

#endif
