/* Q8_0 matmul in integers (kernels/cpu/matmul_q8.h): the canonical quantization of the
 * activations, the portable loops that define the arithmetic, and where a row's blocks live. */
#include "kernels/cpu/matmul_q8.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/row_groups.h"

float pp__q8_act_block(int8_t *q, const float *x)
{
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < PP_Q8_0_BLOCK; i++) {
        float v = fabsf(x[i]);
        if (!(v <= FLT_MAX))
            finite = 0;
        else if (v > amax)
            amax = v;
    }
    float d = amax / 127.0f;
    if (!finite || !(d >= FLT_MIN)) {
        memset(q, 0, PP_Q8_0_BLOCK);
        return finite ? 0.0f : NAN;
    }
    float id = 1.0f / d;
    for (int i = 0; i < PP_Q8_0_BLOCK; i++)
        q[i] = (int8_t)lrintf(x[i] * id);
    return d;
}

void pp__q8_act_portable(int8_t *q, float *d, const float *x, int64_t cols)
{
    for (int64_t b = 0; b < cols / PP_Q8_0_BLOCK; b++)
        d[b] = pp__q8_act_block(q + b * PP_Q8_0_BLOCK, x + b * PP_Q8_0_BLOCK);
}

void pp__q8_act_bind(struct pp_mm_args *a, void *buf)
{
    a->xd = buf;
    a->xq = (const int8_t *)(a->xd + a->n * (a->cols / PP_Q8_0_BLOCK));
}

void pp__q8_act_fill(const struct pp_mm_args *a, pp_q8_act_fn act, int64_t t0, int64_t t1)
{
    int64_t blocks = a->cols / PP_Q8_0_BLOCK;
    for (int64_t t = t0; t < t1; t++)
        act((int8_t *)a->xq + t * a->cols, (float *)a->xd + t * blocks, a->x + t * a->ldx,
            a->cols);
}

void pp__q8_pairs_bind(struct pp_mm_args *a, void *buf)
{
    a->xpair = buf;
    a->xneg = buf ? a->xpair + (a->n + 1) / 2 * (a->cols / PP_Q8_0_BLOCK) * 16 : NULL;
}

void pp__q8_pairs_fill(const struct pp_mm_args *a, pp_q8_pairs_fn fn, int64_t t0, int64_t t1)
{
    assert(t0 % 2 == 0);
    int64_t blocks = a->cols / PP_Q8_0_BLOCK;
    for (int64_t t = t0; t < t1; t += 2) {
        int64_t off = t / 2 * blocks * 16;
        fn((int32_t *)a->xpair + off, (int32_t *)a->xneg + off, a->xq + t * a->cols,
           a->xq + (t + 1 < a->n ? t + 1 : t) * a->cols, blocks);
    }
}

/* One output element in the canonical order. */
static float q8_dot(const char *q, const char *d, int64_t q_stride, int64_t d_stride, int bias,
                    const int8_t *xq, const float *xd, int64_t blocks)
{
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t b = 0; b < blocks; b++) {
        const char *w = q + b * q_stride;
        const int8_t *x = xq + b * PP_Q8_0_BLOCK;
        uint16_t h;
        memcpy(&h, d + b * d_stride, sizeof(h));
        float scale = pp_f16_to_f32(h) * xd[b];
        for (int j = 0; j < 8; j++) {
            int32_t s = 0;
            for (int e = 0; e < 4; e++)
                s += (int32_t)(int8_t)(w[4 * j + e] ^ bias) * x[4 * j + e];
            lane[j] = fmaf((float)s, scale, lane[j]);
        }
    }
    return pp__merge8(lane);
}

void pp__mm_q8_portable(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                        const struct pp_mm_scratch *s)
{
    (void)s;
    int64_t blocks = a->cols / PP_Q8_0_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        const char *q, *d;
        int64_t qs, ds;
        pp__q8_row_at(a, r, &q, &d, &qs, &ds);
        for (int64_t t = 0; t < a->n; t++)
            a->y[t * a->rows + r] = q8_dot(q, d, qs, ds, a->grouped ? PP_Q8_GROUP_BIAS : 0,
                                           a->xq + t * a->cols, a->xd + t * blocks, blocks);
    }
}
