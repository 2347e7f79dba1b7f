/* The Q8_0 integer matmul (kernels/cpu/matmul_q8.h) with AVX-512 VNNI: one vpdpbusd sums four
 * byte products per int32 lane, the unsigned operand being the copy's weights (stored biased) or,
 * for the file's weights, the activations biased (kernels/cpu/matmul_q8_x86.h). One or two
 * tokens take 4 rows on ymm (four streams of weights), three tokens 3 rows × 3 on ymm, and four
 * or more the zmm tiles of 6 rows × 3 token pairs (Q8_ZMM), an odd last token as a pair of
 * itself, or on AMD CPUs (pp_simd_q8_pairs_here) 3 rows × 4 tokens on ymm. */
#include "kernels/cpu/matmul_q8.h"

#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(                                                                     \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))),                \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#endif

#define Q8_BIAS 1
#define Q8_DPBUSD(acc, u, w) _mm256_dpbusd_epi32(acc, u, w)
#define Q8_STREAMS_ONE 4
#define Q8_TOKENS 4
#define Q8_ZMM 1
#define Q8_SPLIT_MIN_TOKENS PP_Q8_SPLIT_MIN_TOKENS_VNNI
#include "kernels/cpu/matmul_q8_x86.h"

void pp__mm_q8_vnni(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                    const struct pp_mm_scratch *s)
{
    q8_rows(a, r0, r1, s);
}

void pp__q8_pairs_vnni(int32_t *xpair, int32_t *xneg, const int8_t *q0, const int8_t *q1,
                       int64_t blocks)
{
    q8z_pairs(xpair, xneg, q0, q1, blocks);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
