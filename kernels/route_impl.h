/* MoE routing of one token, written once for both backends: the CPU backend compiles it as C
 * (kernels/cpu/route.c) and the CUDA backend as device code (kernels/cuda/moe_route.cu), so both
 * run the same sequence of f32 operations (only expf may differ by an ulp between the two math
 * libraries). Nothing here multiplies and adds, so no compiler can fuse it differently. */
#ifndef PP_ROUTE_IMPL_H
#define PP_ROUTE_IMPL_H

#include <math.h>
#include <stdint.h>

#include "kernels/backend.h"

#ifdef __CUDACC__
#define PP_HOST_DEVICE __host__ __device__
#else
#define PP_HOST_DEVICE
#endif

/* In place: p[n] = softmax(p), in index order. */
static inline PP_HOST_DEVICE void pp__route_softmax(float *p, int32_t n)
{
    float max = p[0];
    for (int32_t i = 1; i < n; i++)
        max = p[i] > max ? p[i] : max;
    float sum = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        p[i] = expf(p[i] - max);
        sum += p[i];
    }
    for (int32_t i = 0; i < n; i++)
        p[i] /= sum;
}

/* pick[k] = the k largest of v[n] in decreasing order, ties to the lower index. */
static inline PP_HOST_DEVICE void pp__route_top_k(const float *v, int32_t n, int32_t k,
                                                  int32_t *pick)
{
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++) {
            int taken = 0;
            for (int32_t q = 0; q < j && !taken; q++)
                taken = pick[q] == i;
            if (!taken && (best < 0 || v[i] > v[best]))
                best = i;
        }
        pick[j] = best;
    }
}

/* One token's k experts (increasing id) and weights from its n router logits (overwritten). */
static inline PP_HOST_DEVICE void pp__route_token(float *logits, int32_t n, int32_t k,
                                                  enum pp_route_mode mode, int renormalise,
                                                  int32_t *pick, float *weight)
{
    if (mode == PP_ROUTE_TOPK_SOFTMAX) {
        pp__route_top_k(logits, n, k, pick);
        for (int32_t j = 0; j < k; j++)
            weight[j] = logits[pick[j]];
        pp__route_softmax(weight, k);
    } else {
        pp__route_softmax(logits, n);
        pp__route_top_k(logits, n, k, pick);
        float sum = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            weight[j] = logits[pick[j]];
            sum += weight[j];
        }
        if (renormalise)
            for (int32_t j = 0; j < k; j++)
                weight[j] /= sum;
    }
    /* increasing expert id: the order of the token's sum */
    for (int32_t a = 1; a < k; a++)
        for (int32_t b = a; b > 0 && pick[b - 1] > pick[b]; b--) {
            int32_t ti = pick[b];
            pick[b] = pick[b - 1];
            pick[b - 1] = ti;
            float tw = weight[b];
            weight[b] = weight[b - 1];
            weight[b - 1] = tw;
        }
}

#endif
