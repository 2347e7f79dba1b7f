// RoPE: one thread per (row, frequency, group of 8 heads), rotating that pair in each head. The
// angle is computed in double and its cosine and sine rounded once to f32, as the CPU does, so
// both backends rotate by the same f32 factors.
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/rope.cuh"

#define ROPE_HEADS 8 /* heads per thread */

/* One thread per (row, frequency, group of ROPE_HEADS heads): rotates that pair in each head of
 * the group, loading them all before storing. */
__global__ void rope_kernel(float *x, const int32_t *pos, int64_t n, int32_t n_heads,
                            int32_t head_dim, const float *inv_freq, int neox)
{
    int32_t half = head_dim / 2, groups = (n_heads + ROPE_HEADS - 1) / ROPE_HEADS;
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n * half * groups)
        return;
    int32_t hg = (int32_t)(id % groups);
    int64_t ri = id / groups, r = ri / half;
    int32_t i = (int32_t)(ri % half);
    double angle = (double)pos[r] * (double)inv_freq[i];
    double sd, cd;
    sincos(angle, &sd, &cd);
    float cs = (float)cd, sn = (float)sd;
    int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float *row = x + r * n_heads * (int64_t)head_dim;
    int32_t h0 = hg * ROPE_HEADS;
    float x0[ROPE_HEADS], x1[ROPE_HEADS];
#pragma unroll
    for (int k = 0; k < ROPE_HEADS; k++) {
        int32_t h = h0 + k < n_heads ? h0 + k : h0; /* a real head; not stored */
        x0[k] = row[(int64_t)h * head_dim + a];
        x1[k] = row[(int64_t)h * head_dim + b];
    }
#pragma unroll
    for (int k = 0; k < ROPE_HEADS; k++) {
        if (h0 + k >= n_heads)
            break;
        float *v = row + (int64_t)(h0 + k) * head_dim;
        /* _rn: no fused multiply-add, the CPU's exact arithmetic */
        v[a] = __fsub_rn(__fmul_rn(x0[k], cs), __fmul_rn(x1[k], sn));
        v[b] = __fadd_rn(__fmul_rn(x1[k], cs), __fmul_rn(x0[k], sn));
    }
}

void pp__cuda_rope(struct pp_backend *be, float *x, const int32_t *pos, int64_t n, int32_t n_heads,
                   int32_t head_dim, const float *inv_freq, enum pp_rope_layout layout)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || head_dim < 2 || !pp__cuda_enter(c))
        return;
    const int32_t *d_pos =
        (const int32_t *)pp__cuda_upload(c, PP_CUDA_SLOT_POS, pos, n * (int64_t)sizeof(int32_t));
    if (!d_pos)
        return;
    int64_t items = n * (head_dim / 2) * ((n_heads + ROPE_HEADS - 1) / ROPE_HEADS);
    rope_kernel<<<pp__cuda_blocks(items, PP_CUDA_THREADS), PP_CUDA_THREADS, 0, c->stream>>>(
        x, d_pos, n, n_heads, head_dim, inv_freq, layout == PP_ROPE_NEOX);
    LAUNCH_OK(c, "rope_kernel");
}
