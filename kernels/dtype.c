/* Conversions between f32 and the stored weight types. */
#include "kernels/dtype.h"

#include <math.h>

static const char *const dtype_names[PP_DTYPE_COUNT] = {"f32", "f16", "bf16", "q8_0"};

const char *pp_dtype_name(enum pp_dtype t)
{
    return (unsigned)t < PP_DTYPE_COUNT ? dtype_names[t] : "unknown";
}

int pp_dtype_parse(const char *s)
{
    for (int i = 0; i < PP_DTYPE_COUNT; i++)
        if (strcmp(s, dtype_names[i]) == 0)
            return i;
    return -1;
}

int64_t pp_dtype_row_bytes(enum pp_dtype t, int64_t n)
{
    switch (t) {
    case PP_DTYPE_F32: return n * 4;
    case PP_DTYPE_F16:
    case PP_DTYPE_BF16: return n * 2;
    case PP_DTYPE_Q8_0: return n % PP_Q8_0_BLOCK ? -1 : n / PP_Q8_0_BLOCK * PP_Q8_0_BYTES;
    default: return -1;
    }
}

float pp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0x1f) {
        /* NaNs come out quiet, as the F16C instruction makes them */
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {
        /* subnormal f16: normalise into an f32 normal */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t pp_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u)
        return sign | 0x7e00;
    if (au >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return sign | 0x7c00;
    if (au < 0x38800000u) { /* below the smallest f16 normal: subnormal or zero */
        float af;
        memcpy(&af, &au, 4);
        /* scale so one f16 subnormal ulp (2^-24) is 1.0, then round to nearest even */
        float scaled = af * 16777216.0f;
        return sign | (uint16_t)nearbyintf(scaled);
    }
    uint32_t mant_round = au + 0xfffu + ((au >> 13) & 1u);
    return sign | (uint16_t)((mant_round - 0x38000000u) >> 13);
}

void pp_row_to_f32(float *dst, const void *src, enum pp_dtype t, int64_t n)
{
    switch (t) {
    case PP_DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case PP_DTYPE_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = pp_f16_to_f32(s[i]);
        break;
    }
    case PP_DTYPE_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = pp_bf16_to_f32(s[i]);
        break;
    }
    case PP_DTYPE_Q8_0: {
        const uint8_t *b = src;
        for (int64_t i = 0; i < n; i += PP_Q8_0_BLOCK, b += PP_Q8_0_BYTES) {
            uint16_t dh;
            memcpy(&dh, b, 2);
            float d = pp_f16_to_f32(dh);
            const int8_t *q = (const int8_t *)(b + 2);
            for (int j = 0; j < PP_Q8_0_BLOCK; j++)
                dst[i + j] = d * (float)q[j];
        }
        break;
    }
    default: break;
    }
}

int64_t pp_q8_0_first_nonfinite(const void *blocks, int64_t n)
{
    const uint8_t *b = blocks;
    for (int64_t i = 0; i < n; i++, b += PP_Q8_0_BYTES) {
        uint16_t h;
        memcpy(&h, b, 2);
        if ((h & 0x7C00) == 0x7C00) /* all exponent bits set: inf or NaN */
            return i;
    }
    return -1;
}

void pp_quantize_q8_0(void *dst, const float *src, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i += PP_Q8_0_BLOCK, b += PP_Q8_0_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < PP_Q8_0_BLOCK; j++)
            amax = fmaxf(amax, fabsf(src[i + j]));
        uint16_t dh = pp_f32_to_f16(amax / 127.0f);
        float d = pp_f16_to_f32(dh);
        float inv = d != 0.0f ? 1.0f / d : 0.0f;
        memcpy(b, &dh, 2);
        int8_t *q = (int8_t *)(b + 2);
        for (int j = 0; j < PP_Q8_0_BLOCK; j++) {
            float v = roundf(src[i + j] * inv);
            q[j] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
        }
    }
}

int pp_convert_range(void *dst, enum pp_dtype dst_t, const void *src, enum pp_dtype src_t,
                     int64_t first, int64_t n)
{
    if (n < 0 || first < 0)
        return -1;
    if (dst_t == src_t && dst_t != PP_DTYPE_Q8_0) {
        size_t elem = dst_t == PP_DTYPE_F32 ? 4 : 2;
        memcpy(dst, (const char *)src + (size_t)first * elem, (size_t)n * elem);
        return 0;
    }
    if (dst_t != PP_DTYPE_BF16)
        return -1;
    uint16_t *out = dst;
    if (src_t == PP_DTYPE_F32) {
        const float *s = (const float *)src + first;
        for (int64_t i = 0; i < n; i++)
            out[i] = pp_f32_to_bf16(s[i]);
        return 0;
    }
    if (src_t != PP_DTYPE_Q8_0 || first % PP_Q8_0_BLOCK != 0 || n % PP_Q8_0_BLOCK != 0)
        return -1;
    const uint8_t *b = (const uint8_t *)src + (first / PP_Q8_0_BLOCK) * PP_Q8_0_BYTES;
    float block[PP_Q8_0_BLOCK];
    for (int64_t i = 0; i < n; i += PP_Q8_0_BLOCK, b += PP_Q8_0_BYTES) {
        pp_row_to_f32(block, b, PP_DTYPE_Q8_0, PP_Q8_0_BLOCK);
        for (int j = 0; j < PP_Q8_0_BLOCK; j++)
            out[i + j] = pp_f32_to_bf16(block[j]);
    }
    return 0;
}
