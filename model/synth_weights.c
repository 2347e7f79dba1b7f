/* Deterministic weight values of a synthetic model and their encoding into the stored types.
 *
 * Each element is a pure function of (seed, HF tensor name, flat HF element index): a counter-based
 * hash (the splitmix64 finalizer over a per-tensor key plus the index), never a sequential stream,
 * so any row can be produced on its own and the GGUF copy (permuted rows, other storage types)
 * holds exactly the values of the HF copy. The arithmetic is float-only and exact up to one
 * rounding per step, so the values do not depend on the compiler or libm. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "model/synth-impl.h"

#define GAMMA 0x9e3779b97f4a7c15ull
#define EMIT_CHUNK_BYTES ((uint64_t)4 << 20)

static uint64_t fmix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

void pp__synth_values(uint64_t seed, const struct pp__synth_tensor *t, int64_t first, int64_t n,
                      float *out)
{
    uint64_t key = fmix64(seed + GAMMA) ^ fmix64(fnv1a64(t->hf_name) + 2 * GAMMA);
    /* variance 1/in per linear weight keeps activations O(1); sqrtf is correctly rounded */
    float scale = t->kind == PP__SYNTH_LINEAR ? sqrtf(3.0f / (float)t->shape[1])
                  : t->kind == PP__SYNTH_GATE ? sqrtf(3.0f / (float)t->shape[0])
                                              : 1.0f;
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = fmix64(key + (uint64_t)(first + i) * GAMMA);
        /* 24 random bits -> a uniform value in [-1, 1), exact in f32 */
        float x = (float)((int32_t)(u >> 40) - (1 << 23)) * (1.0f / 8388608.0f);
        /* one multiply, or a divide then an add: nothing a compiler may fuse into an FMA, so
         * the values do not depend on -ffp-contract */
        switch (t->kind) {
        case PP__SYNTH_EMBED:
            out[i] = x;
            break;
        case PP__SYNTH_LINEAR:
        case PP__SYNTH_GATE:
            out[i] = x * scale;
            break;
        case PP__SYNTH_NORM:
            out[i] = 1.0f + x / 5.0f;
            break;
        case PP__SYNTH_BIAS:
            out[i] = x / 10.0f;
            break;
        }
    }
}

enum pp_dtype pp__synth_store_type(const struct pp__synth_model *m,
                                   const struct pp__synth_tensor *t, int gguf)
{
    if (gguf)
        return t->n_dims == 1 ? PP_DTYPE_F32 : m->s.dtype;
    return m->s.dtype == PP_DTYPE_Q8_0 ? PP_DTYPE_F32 : m->s.dtype;
}

/* The canonical f32 values: raw values rounded to the model dtype. */
static void canonical(const float *raw, int64_t n, enum pp_dtype model_dtype, int matrix,
                      float *dst, float *scratch)
{
    switch (model_dtype) {
    case PP_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = pp_f16_to_f32(pp_f32_to_f16(raw[i]));
        break;
    case PP_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = pp_bf16_to_f32(pp_f32_to_bf16(raw[i]));
        break;
    case PP_DTYPE_Q8_0:
        if (matrix) {
            /* n*34/32 bytes of blocks fit in the n floats of scratch */
            pp_quantize_q8_0(scratch, raw, n);
            pp_row_to_f32(dst, scratch, PP_DTYPE_Q8_0, n);
            break;
        }
        memcpy(dst, raw, (size_t)n * sizeof(float));
        break;
    default:
        memcpy(dst, raw, (size_t)n * sizeof(float));
        break;
    }
}

void pp__synth_encode(const float *raw, int64_t n, enum pp_dtype model_dtype, int matrix,
                      enum pp_dtype store, void *dst, float *scratch)
{
    uint16_t *h = dst;
    switch (store) {
    case PP_DTYPE_Q8_0:
        pp_quantize_q8_0(dst, raw, n);
        break;
    case PP_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            h[i] = pp_f32_to_f16(raw[i]);
        break;
    case PP_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            h[i] = pp_f32_to_bf16(raw[i]);
        break;
    default:
        canonical(raw, n, model_dtype, matrix, dst, scratch);
        break;
    }
}

/* 1-D tensors (norms, biases) are small: generated whole, permuted as elements if needed. */
static pp_status emit_vector(const struct pp__synth_model *m, const struct pp__synth_tensor *t,
                             int gguf, pp__synth_sink sink, void *ctx)
{
    int64_t n = t->shape[0];
    enum pp_dtype store = pp__synth_store_type(m, t, gguf);
    float *raw = pp_alloc(PP_MEM_MISC, (size_t)n * sizeof(float) * 3);
    if (!raw)
        return pp_error(PP_ERR_NOMEM, "synth: no memory for tensor %s", t->hf_name);
    float *perm = raw + n, *out = raw + 2 * n;
    pp__synth_values(m->s.seed, t, 0, n, raw);
    if (gguf && t->perm_heads)
        for (int64_t r = 0; r < n; r++)
            perm[r] = raw[pp__synth_gguf_row_to_hf(r, t->perm_heads, n)];
    else
        memcpy(perm, raw, (size_t)n * sizeof(float));
    pp__synth_encode(perm, n, m->s.dtype, 0, store, out, raw);
    pp_status st = sink(ctx, out, (uint64_t)pp_dtype_row_bytes(store, n));
    pp_free(PP_MEM_MISC, raw);
    return st;
}

static pp_status emit_matrix(const struct pp__synth_model *m, const struct pp__synth_tensor *t,
                             int gguf, pp__synth_sink sink, void *ctx)
{
    int64_t rows = t->shape[0], cols = t->shape[1];
    enum pp_dtype store = pp__synth_store_type(m, t, gguf);
    uint64_t row_bytes = (uint64_t)pp_dtype_row_bytes(store, cols);
    uint64_t chunk_rows = EMIT_CHUNK_BYTES / row_bytes ? EMIT_CHUNK_BYTES / row_bytes : 1;
    float *raw = pp_alloc(PP_MEM_MISC, (size_t)cols * sizeof(float) * 2);
    uint8_t *out = pp_alloc(PP_MEM_MISC, (size_t)(chunk_rows * row_bytes));
    pp_status st = PP_OK;
    if (!raw || !out) {
        st = pp_error(PP_ERR_NOMEM, "synth: no memory for a chunk of tensor %s", t->hf_name);
        goto done;
    }
    uint64_t filled = 0;
    for (int64_t r = 0; r < rows && st == PP_OK; r++) {
        int64_t hr = gguf && t->perm_heads ? pp__synth_gguf_row_to_hf(r, t->perm_heads, rows) : r;
        pp__synth_values(m->s.seed, t, hr * cols, cols, raw);
        pp__synth_encode(raw, cols, m->s.dtype, 1, store, out + filled * row_bytes, raw + cols);
        if (++filled == chunk_rows || r == rows - 1) {
            st = sink(ctx, out, filled * row_bytes);
            filled = 0;
        }
    }
done:
    pp_free(PP_MEM_MISC, out);
    pp_free(PP_MEM_MISC, raw);
    return st;
}

pp_status pp__synth_emit(const struct pp__synth_model *m, const struct pp__synth_tensor *t,
                         int gguf, pp__synth_sink sink, void *ctx)
{
    return t->n_dims == 1 ? emit_vector(m, t, gguf, sink, ctx) : emit_matrix(m, t, gguf, sink, ctx);
}
