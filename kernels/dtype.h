/* Weight element types and their exact conversions to f32. Every conversion here is exact (f16,
 * bf16 and Q8_0 values are all representable in f32), so a weight gives the same f32 value on every
 * backend and in the numpy reference. */
#ifndef PP_DTYPE_H
#define PP_DTYPE_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pp_dtype {
    PP_DTYPE_F32 = 0,
    PP_DTYPE_F16,
    PP_DTYPE_BF16,
    PP_DTYPE_Q8_0,
    PP_DTYPE_COUNT
};

#define PP_Q8_0_BLOCK 32 /* values per Q8_0 block */
#define PP_Q8_0_BYTES 34 /* f16 scale + 32 int8 */

/* "f32", "f16", "bf16", "q8_0". */
const char *pp_dtype_name(enum pp_dtype t);
/* Parses a name as above; returns -1 when unknown. */
int pp_dtype_parse(const char *s);
/* Bytes for a row of n elements (n must be a multiple of 32 for Q8_0); -1 when it is not. */
int64_t pp_dtype_row_bytes(enum pp_dtype t, int64_t n);

static inline float pp_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t pp_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float pp_f16_to_f32(uint16_t h);
/* Round to nearest even, overflow to infinity. */
uint16_t pp_f32_to_f16(float f);

/* Converts n elements of a row stored as t into f32 (Q8_0: n a multiple of 32). */
void pp_row_to_f32(float *dst, const void *src, enum pp_dtype t, int64_t n);

/* dst[n] as dst_t = elements [first, first + n) of a tensor stored as src_t, for loading weights
 * onto a device: the same type is copied (f32, f16, bf16); f32 and Q8_0 become bf16 (Q8_0 values
 * exactly as pp_row_to_f32 gives them, then rounded to nearest even; Q8_0 ranges in whole 32-value
 * blocks). Returns 0, or -1 for another pair of types or a misaligned Q8_0 range. */
int pp_convert_range(void *dst, enum pp_dtype dst_t, const void *src, enum pp_dtype src_t,
                     int64_t first, int64_t n);

/* The index of the first of n Q8_0 blocks at blocks whose f16 scale is infinite or NaN, or -1 when
 * every scale is finite. */
int64_t pp_q8_0_first_nonfinite(const void *blocks, int64_t n);

/* Quantizes n f32 values (a multiple of 32) to Q8_0 blocks: d = max|x|/127 stored as f16,
 * q = round(x/d). */
void pp_quantize_q8_0(void *dst, const float *src, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
