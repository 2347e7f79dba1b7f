/* The CUDA backend's speed against the GPU's own limits, both measured in this run:
 *   - copy bandwidth: cudaMemcpy device to device of a 1 GiB buffer, bytes read + written per
 * second;
 *   - cuBLAS's GEMM rate: an 8192^3 bf16 x bf16 -> f32 GEMM with f32 accumulation (the same kind
 *     of call the backend makes for prefill);
 *   - decode at batch 1 and 32 and prefill through the executor on a 4-layer slice of an
 *     8B-shaped bf16 model (dim 4096, 32 heads, 8 KV heads, FFN 14336, vocab 128256, embedding
 *     and LM head included) whose weights are generated on the device (pp_cuda_fill_uniform).
 * Decode reports the bytes a step must read (weights, KV, embedding rows) per second as a fraction
 * of the copy bandwidth; prefill reports FLOP/s (matmuls + attention) as a fraction of cuBLAS's
 * rate. The JSON file (--json) is rewritten after every measurement, so a run cut short still
 * leaves what was measured.
 *
 * Exit status: 0 measured, 1 an error, 77 no usable GPU (nothing run), 2 bad usage. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#include "model/executor.h"
#include "model/kv_cache.h"
#include "model/model.h"

#define LAYERS 4
#define DECODE_CONTEXT 512 /* tokens each decoding sequence holds before the timed steps */
#define DECODE_STEPS 32
#define PREFILL_TOKENS 2048

/* Exits on a failed CUDA/cuBLAS call of the bench itself, naming it. */
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_gpu: %s: %s\n", #call, cudaGetErrorString(e_));                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CKB(call)                                                                                  \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "bench_gpu: %s: %s\n", #call, cublasGetStatusString(s_));              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CKP(what, call)                                                                            \
    do {                                                                                           \
        if ((call) != PP_OK) {                                                                     \
            fprintf(stderr, "bench_gpu: %s: %s\n", what, pp_error_detail());                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* What the JSON file holds; negative = not measured (yet). */
struct figures {
    char device[160];
    double copy_gbps;
    double cublas_tflops;
    double decode_ms[2], decode_gbps[2], decode_frac[2], decode_tok_s[2];
    double prefill_ms, prefill_tflops, prefill_frac;
    /* where the time goes: each GEMV shape alone (weight bytes per second), a decode step's and
     * the prefill's GPU time with the host's launches hidden behind a delay kernel, and the
     * prefill's matmuls alone */
    double gemv_gbps[4];
    double decode_gpu_ms[2];
    double prefill_gpu_ms, prefill_matmul_ms;
    /* one layer's attention and its other small ops (norms, RoPE, KV store, adds, SwiGLU) alone:
     * [0] the prefill's 2048 tokens from position 0, [1] one token at position 512 */
    double attn_ms[2], small_ms[2];
};

static const char *const gemv_names[4] = {"lm_head", "ffn_gate", "wq", "wk"};

static const char *json_path;

static void write_json(const struct figures *f)
{
    if (!json_path)
        return;
    FILE *o = fopen(json_path, "w");
    if (!o) {
        fprintf(stderr, "bench_gpu: cannot write %s\n", json_path);
        exit(1);
    }
    fprintf(o, "{\"device\": \"%s\", \"model\": \"8B-shaped bf16, %d layers + embedding + LM "
            "head\",\n", f->device, LAYERS);
    fprintf(o, " \"copy_bandwidth_GBps\": %.1f, \"cublas_bf16_gemm_TFLOPs\": %.1f,\n",
            f->copy_gbps, f->cublas_tflops);
    const int batch[2] = {1, 32};
    for (int i = 0; i < 2; i++)
        fprintf(o, " \"decode_batch%d\": {\"context\": %d, \"step_ms\": %.4f, \"tokens_per_s\": "
                "%.1f, \"bytes_per_s_GB\": %.1f, \"fraction_of_copy_bandwidth\": %.3f},\n",
                batch[i], DECODE_CONTEXT, f->decode_ms[i], f->decode_tok_s[i], f->decode_gbps[i],
                f->decode_frac[i]);
    fprintf(o, " \"prefill\": {\"tokens\": %d, \"ms\": %.3f, \"TFLOPs\": %.1f, "
            "\"fraction_of_cublas\": %.3f},\n", PREFILL_TOKENS, f->prefill_ms, f->prefill_tflops,
            f->prefill_frac);
    fprintf(o, " \"breakdown\": {\"gemv_GBps\": {");
    for (int i = 0; i < 4; i++)
        fprintf(o, "%s\"%s\": %.1f", i ? ", " : "", gemv_names[i], f->gemv_gbps[i]);
    fprintf(o, "}, \"decode_gpu_ms\": [%.4f, %.4f], \"prefill_gpu_ms\": %.3f, "
            "\"prefill_matmul_ms\": %.3f,\n  \"layer_attention_ms\": {\"prefill\": %.4f, "
            "\"decode\": %.4f}, \"layer_small_ops_ms\": {\"prefill\": %.4f, \"decode\": %.4f}}}\n",
            f->decode_gpu_ms[0], f->decode_gpu_ms[1], f->prefill_gpu_ms, f->prefill_matmul_ms,
            f->attn_ms[0], f->attn_ms[1], f->small_ms[0], f->small_ms[1]);
    if (fclose(o) != 0) {
        fprintf(stderr, "bench_gpu: writing %s failed\n", json_path);
        exit(1);
    }
}

/* The best of reps - 2 timed runs of run(ctx) on the default stream (two warm-ups), in ms. */
static float best_ms(void (*run)(void *), void *ctx, int reps)
{
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    float best = 1e30f;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(t0, 0));
        run(ctx);
        CK(cudaEventRecord(t1, 0));
        CK(cudaEventSynchronize(t1));
        float ms;
        CK(cudaEventElapsedTime(&ms, t0, t1));
        if (i >= 2 && ms < best)
            best = ms;
    }
    CK(cudaEventDestroy(t0));
    CK(cudaEventDestroy(t1));
    return best;
}

struct copy_job {
    void *dst, *src;
    size_t bytes;
};

static void run_copy(void *ctx)
{
    struct copy_job *j = ctx;
    CK(cudaMemcpyAsync(j->dst, j->src, j->bytes, cudaMemcpyDeviceToDevice, 0));
}

static double copy_bandwidth(void)
{
    struct copy_job j = {NULL, NULL, (size_t)1 << 30};
    CK(cudaMalloc(&j.src, j.bytes));
    CK(cudaMalloc(&j.dst, j.bytes));
    CK(cudaMemset(j.src, 1, j.bytes));
    float ms = best_ms(run_copy, &j, 12);
    CK(cudaFree(j.src));
    CK(cudaFree(j.dst));
    return 2.0 * (double)j.bytes / (ms * 1e-3) / 1e9; /* read + write */
}

struct gemm_job {
    cublasHandle_t h;
    int n;
    void *a, *b, *c;
};

static void run_gemm(void *ctx)
{
    struct gemm_job *j = ctx;
    const float one = 1.0f, zero = 0.0f;
    CKB(cublasGemmEx(j->h, CUBLAS_OP_T, CUBLAS_OP_N, j->n, j->n, j->n, &one, j->a, CUDA_R_16BF,
                     j->n, j->b, CUDA_R_16BF, j->n, &zero, j->c, CUDA_R_32F, j->n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static double cublas_rate(struct pp_backend *be)
{
    struct gemm_job j = {NULL, 8192, NULL, NULL, NULL};
    size_t nn = (size_t)j.n * j.n;
    CK(cudaMalloc(&j.a, nn * 2));
    CK(cudaMalloc(&j.b, nn * 2));
    CK(cudaMalloc(&j.c, nn * 4));
    pp_cuda_fill_uniform(be, j.a, PP_DTYPE_BF16, (int64_t)nn, 1, 1.0f);
    pp_cuda_fill_uniform(be, j.b, PP_DTYPE_BF16, (int64_t)nn, 2, 1.0f);
    CKP("fill", be->ops->sync(be));
    CKB(cublasCreate(&j.h));
    float ms = best_ms(run_gemm, &j, 8);
    CKB(cublasDestroy(j.h));
    CK(cudaFree(j.a));
    CK(cudaFree(j.b));
    CK(cudaFree(j.c));
    return 2.0 * (double)nn * j.n / (ms * 1e-3) / 1e12;
}

/* --- the model, generated on the device ---------------------------------------------------------
 */

static uint64_t seed = 100;
static int64_t weight_bytes; /* of the 2-D weights read per forward (embedding rows excluded) */

static struct pp_weight dev_weight(struct pp_backend *be, int64_t rows, int64_t cols, int counted)
{
    void *p = NULL;
    CKP("weight", be->ops->buf_alloc(be, PP_MEM_WEIGHTS, rows * cols * 2, &p));
    pp_cuda_fill_uniform(be, p, PP_DTYPE_BF16, rows * cols, seed++, 0.02f);
    if (counted)
        weight_bytes += rows * cols * 2;
    return (struct pp_weight){p, PP_DTYPE_BF16, rows, cols};
}

static float *dev_vec(struct pp_backend *be, int64_t n, float scale)
{
    void *p = NULL;
    CKP("vector", be->ops->buf_alloc(be, PP_MEM_WEIGHTS, n * 4, &p));
    pp_cuda_fill_uniform(be, p, PP_DTYPE_F32, n, seed++, scale);
    return p;
}

static void model_init(struct pp_model *m, struct pp_layer_weights *layers, struct pp_backend *be)
{
    memset(m, 0, sizeof(*m));
    struct pp_model_config *c = &m->cfg;
    c->arch = PP_ARCH_LLAMA;
    c->format = PP_FORMAT_HF;
    c->dim = 4096;
    c->n_layers = LAYERS;
    c->n_heads = 32;
    c->n_kv_heads = 8;
    c->head_dim = 128;
    c->ffn_dim = 14336;
    c->vocab_size = 128256;
    c->max_context = 4096;
    c->norm_eps = 1e-5f;
    c->rope_theta = 500000.0f;
    c->rope_layout = PP_ROPE_NEOX;
    c->bos_id = c->eos_id = -1;
    m->first_layer = 0;
    m->last_layer = LAYERS;
    m->has_embedding = m->has_head = 1;
    m->resident = 1;
    m->layers = layers;
    int64_t d = c->dim, kv = (int64_t)c->n_kv_heads * c->head_dim, f = c->ffn_dim;
    for (int l = 0; l < LAYERS; l++) {
        struct pp_layer_weights *w = &layers[l];
        memset(w, 0, sizeof(*w));
        w->wq = dev_weight(be, d, d, 1);
        w->wk = dev_weight(be, kv, d, 1);
        w->wv = dev_weight(be, kv, d, 1);
        w->wo = dev_weight(be, d, d, 1);
        w->w_gate = dev_weight(be, f, d, 1);
        w->w_up = dev_weight(be, f, d, 1);
        w->w_down = dev_weight(be, d, f, 1);
        w->attn_norm = dev_vec(be, d, 1.0f);
        w->ffn_norm = dev_vec(be, d, 1.0f);
    }
    m->embedding = dev_weight(be, c->vocab_size, d, 0);
    m->lm_head = dev_weight(be, c->vocab_size, d, 1);
    m->final_norm = dev_vec(be, d, 1.0f);
    float inv[64];
    pp_rope_inv_freq(c, NULL, inv);
    CKP("inv_freq", be->ops->buf_alloc(be, PP_MEM_WEIGHTS, sizeof(inv), (void **)&m->inv_freq));
    be->ops->copy_in(be, m->inv_freq, inv, sizeof(inv));
    CKP("generating the weights", be->ops->sync(be));
}

/* --- measurements -------------------------------------------------------------------------------
 */

static int32_t *tokens(int64_t n)
{
    int32_t *t = malloc((size_t)n * sizeof(int32_t));
    if (!t) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)(1 + (i * 7919) % 128000);
    return t;
}

/* Prefills `batch` sequences (ids base..) of len tokens each, in windows of the executor. */
static void prefill(struct pp_executor *ex, int batch, int len, uint64_t base, float *logits)
{
    struct pp_exec_seq *s = calloc((size_t)batch, sizeof(*s));
    int32_t *t = tokens((int64_t)batch * len);
    for (int i = 0; i < batch; i++)
        s[i] = (struct pp_exec_seq){base + (uint64_t)i, 0, len, 1};
    struct pp_exec_batch b = {batch, s, t, NULL};
    CKP("prefill", pp_executor_forward(ex, &b, NULL, logits));
    free(s);
    free(t);
}

static void release(struct pp_executor *ex, int batch, uint64_t base)
{
    for (int i = 0; i < batch; i++)
        pp_executor_release(ex, base + (uint64_t)i);
}

/* Seconds per decode step of `batch` sequences holding DECODE_CONTEXT tokens; *kv_bytes: the K
 * and V a step reads and writes, kv_pos_bytes per position. */
static double decode(struct pp_backend *be, struct pp_executor *ex, int batch, float *logits,
                     int64_t kv_pos_bytes, int64_t *kv_bytes, double *gpu_s)
{
    uint64_t base = 1000;
    prefill(ex, batch, DECODE_CONTEXT, base, logits);
    struct pp_exec_seq *s = calloc((size_t)batch, sizeof(*s));
    int32_t *t = tokens(batch);
    double best = 1e30;
    *kv_bytes = 0;
    for (int step = 0; step < DECODE_STEPS + 3; step++) {
        for (int i = 0; i < batch; i++)
            s[i] = (struct pp_exec_seq){base + (uint64_t)i, DECODE_CONTEXT + step, 1, 1};
        struct pp_exec_batch b = {batch, s, t, NULL};
        double t0 = pp_clock_mono();
        CKP("decode", pp_executor_forward(ex, &b, NULL, logits));
        double dt = pp_clock_mono() - t0;
        if (step >= 3 && dt < best) {
            best = dt;
            /* K and V of every position seen (read) plus this one (written) */
            *kv_bytes = (int64_t)batch * (DECODE_CONTEXT + step + 1) * kv_pos_bytes;
        }
    }
    /* the same steps queued behind a 20 ms delay: the GPU's own time */
    *gpu_s = 1e30;
    for (int step = DECODE_STEPS + 3; step < DECODE_STEPS + 6; step++) {
        for (int i = 0; i < batch; i++)
            s[i] = (struct pp_exec_seq){base + (uint64_t)i, DECODE_CONTEXT + step, 1, 1};
        struct pp_exec_batch b = {batch, s, t, NULL};
        CKP("sync", be->ops->sync(be));
        double t0 = pp_clock_mono();
        pp_cuda_delay(be, 20000);
        CKP("decode", pp_executor_forward(ex, &b, NULL, logits));
        double dt = pp_clock_mono() - t0 - 0.020;
        if (dt < *gpu_s)
            *gpu_s = dt;
    }
    release(ex, batch, base);
    free(s);
    free(t);
    return best;
}

/* Weight bytes per second of one-token matmuls on w, 40 queued back to back. */
static double gemv_rate(struct pp_backend *be, const struct pp_weight *w)
{
    float *x = NULL, *y = NULL;
    CKP("gemv buffers", be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, w->cols * 4, (void **)&x));
    CKP("gemv buffers", be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, w->rows * 4, (void **)&y));
    pp_cuda_fill_uniform(be, x, PP_DTYPE_F32, w->cols, 7, 1.0f);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        CKP("sync", be->ops->sync(be));
        pp_cuda_delay(be, 5000);
        double t0 = pp_clock_mono();
        for (int i = 0; i < 40; i++)
            be->ops->matmul(be, y, x, w, 1);
        CKP("gemv", be->ops->sync(be));
        double dt = (pp_clock_mono() - t0 - 0.005) / 40;
        best = dt < best ? dt : best;
    }
    be->ops->buf_free(be, PP_MEM_ACTIVATIONS, x);
    be->ops->buf_free(be, PP_MEM_ACTIVATIONS, y);
    return (double)w->rows * w->cols * 2 / best / 1e9;
}

/* Seconds of the prefill's layer matmuls alone (PREFILL_TOKENS tokens, every layer), GPU time. */
static double prefill_matmuls(struct pp_backend *be, const struct pp_layer_weights *layers)
{
    int64_t widest = 14336;
    float *x = NULL, *y = NULL;
    int64_t bytes = (int64_t)PREFILL_TOKENS * widest * 4;
    CKP("matmul buffers", be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, bytes, (void **)&x));
    CKP("matmul buffers", be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, bytes, (void **)&y));
    pp_cuda_fill_uniform(be, x, PP_DTYPE_F32, PREFILL_TOKENS * widest, 8, 1.0f);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        CKP("sync", be->ops->sync(be));
        pp_cuda_delay(be, 20000);
        double t0 = pp_clock_mono();
        for (int l = 0; l < LAYERS; l++) {
            const struct pp_layer_weights *w = &layers[l];
            const struct pp_weight *all[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate,
                                              &w->w_up, &w->w_down};
            for (int i = 0; i < 7; i++)
                be->ops->matmul(be, y, x, all[i], PREFILL_TOKENS);
        }
        CKP("matmuls", be->ops->sync(be));
        double dt = pp_clock_mono() - t0 - 0.020;
        best = dt < best ? dt : best;
    }
    be->ops->buf_free(be, PP_MEM_ACTIVATIONS, x);
    be->ops->buf_free(be, PP_MEM_ACTIVATIONS, y);
    return best;
}

/* GPU seconds per call of one layer's attention (*attn) and of its other small ops (*small) for
 * one sequence of n tokens at position pos, 8B shape, each queued 10 times behind a delay. */
static int layer_ops_once; /* --profile: each op once, untimed */

static void layer_ops(struct pp_backend *be, const struct pp_model *m, int32_t n, int32_t pos,
                      double *attn, double *small)
{
    const struct pp_model_config *c = &m->cfg;
    int32_t hd = c->head_dim, kv_dim = c->n_kv_heads * hd, q_dim = c->n_heads * hd, bs = 16;
    int32_t n_blocks = (pos + n + bs - 1) / bs;
    int64_t block_elems = (int64_t)bs * kv_dim, d = c->dim, f = c->ffn_dim;
    int32_t *bt = malloc((size_t)n_blocks * 4), *posv = malloc((size_t)n * 4);
    if (!bt || !posv) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
        exit(1);
    }
    for (int32_t i = 0; i < n_blocks; i++)
        bt[i] = i;
    for (int32_t i = 0; i < n; i++)
        posv[i] = pos + i;
    float *pool, *qb, *kb, *vb, *out, *x, *xb, *gate, *up;
    int64_t sizes[9] = {n_blocks * 2 * block_elems, (int64_t)n * q_dim, (int64_t)n * kv_dim,
                        (int64_t)n * kv_dim, (int64_t)n * q_dim, n * d, n * d, n * f, n * f};
    float **bufs[9] = {&pool, &qb, &kb, &vb, &out, &x, &xb, &gate, &up};
    for (int i = 0; i < 9; i++) {
        CKP("layer buffers", be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, sizes[i] * 4,
                                                (void **)bufs[i]));
        pp_cuda_fill_uniform(be, *bufs[i], PP_DTYPE_F32, sizes[i], 40 + (uint64_t)i, 1.0f);
    }
    struct pp_kv_view kv = {pool, 1, bs, kv_dim, block_elems};
    struct pp_attn_seq seq = {0, n, pos, bt};
    struct pp_attn_shape shape = {c->n_heads, c->n_kv_heads, hd, 0, 0.08838835f};
    const struct pp_layer_weights *w = &m->layers[0];
    *attn = *small = 1e30;
    int reps = layer_ops_once ? 1 : 3, calls = layer_ops_once ? 1 : 10;
    for (int what = 0; what < 2; what++)
        for (int rep = 0; rep < reps; rep++) {
            CKP("sync", be->ops->sync(be));
            if (!layer_ops_once)
                pp_cuda_delay(be, 20000);
            double t0 = pp_clock_mono();
            for (int i = 0; i < calls; i++) {
                if (what == 0) {
                    be->ops->attention(be, out, qb, &kv, 0, &seq, 1, &shape);
                    continue;
                }
                be->ops->rmsnorm(be, xb, x, w->attn_norm, n, d, c->norm_eps);
                be->ops->rope(be, qb, posv, n, c->n_heads, hd, m->inv_freq, c->rope_layout);
                be->ops->rope(be, kb, posv, n, c->n_kv_heads, hd, m->inv_freq, c->rope_layout);
                be->ops->kv_store(be, &kv, 0, &seq, 1, kb, vb);
                be->ops->add(be, x, xb, n * d);
                be->ops->rmsnorm(be, xb, x, w->ffn_norm, n, d, c->norm_eps);
                be->ops->swiglu(be, gate, gate, up, n * f);
                be->ops->add(be, x, xb, n * d);
            }
            CKP("layer ops", be->ops->sync(be));
            double dt = (pp_clock_mono() - t0 - 0.020) / 10;
            double *best = what == 0 ? attn : small;
            *best = dt < *best ? dt : *best;
        }
    for (int i = 0; i < 9; i++)
        be->ops->buf_free(be, PP_MEM_ACTIVATIONS, *bufs[i]);
    free(bt);
    free(posv);
}

int main(int argc, char **argv)
{
    int profile = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json_path = argv[++i];
        } else if (strcmp(argv[i], "--profile") == 0) {
            profile = 1;
        } else {
            fprintf(stderr, "usage: bench_gpu [--json FILE] [--profile]\n--profile: only one "
                    "layer's ops, once each (prefill and decode) and a decode step, for a "
                    "profiler\n");
            return 2;
        }
    }
    struct figures f;
    memset(&f, 0, sizeof(f));
    for (int i = 0; i < 2; i++)
        f.decode_ms[i] = f.decode_gbps[i] = f.decode_frac[i] = f.decode_tok_s[i] = -1;
    f.copy_gbps = f.cublas_tflops = f.prefill_ms = f.prefill_tflops = f.prefill_frac = -1;
    f.prefill_gpu_ms = f.prefill_matmul_ms = f.decode_gpu_ms[0] = f.decode_gpu_ms[1] = -1;
    f.attn_ms[0] = f.attn_ms[1] = f.small_ms[0] = f.small_ms[1] = -1;
    for (int i = 0; i < 4; i++)
        f.gemv_gbps[i] = -1;
    struct pp_backend *be = NULL;
    if (pp_backend_cuda_new(0, 0, &be) != PP_OK) {
        fprintf(stderr, "bench_gpu: no usable GPU, nothing run: %s\n", pp_error_detail());
        return 77;
    }
    struct pp_cuda_device_info info;
    CKP("device query", pp_cuda_device_query(0, &info));
    snprintf(f.device, sizeof(f.device), "%s, sm_%d%d, %.0f GiB", info.name, info.major,
             info.minor, (double)info.memory_bytes / (1 << 30));
    printf("device: %s\n", f.device);
    write_json(&f);

    f.copy_gbps = copy_bandwidth();
    printf("copy bandwidth (read + write): %.1f GB/s\n", f.copy_gbps);
    write_json(&f);
    f.cublas_tflops = cublas_rate(be);
    printf("cuBLAS bf16 GEMM 8192^3 (f32 out): %.1f TFLOP/s\n", f.cublas_tflops);
    write_json(&f);

    struct pp_model m;
    struct pp_layer_weights layers[LAYERS];
    if (profile) {
        model_init(&m, layers, be);
        layer_ops_once = 1;
        double at, sm;
        layer_ops(be, &m, PREFILL_TOKENS, 0, &at, &sm);
        layer_ops(be, &m, 1, DECODE_CONTEXT, &at, &sm);
        float *x = NULL, *y = NULL;
        CKP("buffers", be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, 1 << 20, (void **)&x));
        CKP("buffers", be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, 1 << 20, (void **)&y));
        const struct pp_weight *gw[3] = {&layers[0].wq, &layers[0].wk, &layers[0].w_gate};
        for (int i = 0; i < 3; i++)
            be->ops->matmul(be, y, x, gw[i], 1);
        CKP("profile", be->ops->sync(be));
        return 0;
    }
    model_init(&m, layers, be);
    struct pp_executor_opts eo = {0};
    eo.max_batch_tokens = PREFILL_TOKENS;
    eo.max_seqs = 33;
    eo.max_context = PREFILL_TOKENS + 64;
    const struct pp_model_config *c = &m.cfg;
    int64_t kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    eo.kv_block_size = 16;
    eo.kv_budget_bytes = 33 * (int64_t)((eo.max_context + 15) / 16) *
                         pp_kv_block_bytes(LAYERS, (int32_t)kv_dim, 16);
    struct pp_executor *ex = NULL;
    CKP("executor", pp_executor_new(&m, be, &eo, &ex));
    /* pinned, as a server's logits buffer would be: a step's time includes copying its logits
     * rows to the host (32 x 128256 floats = 16 MB at batch 32) */
    float *logits = NULL;
    CK(cudaMallocHost((void **)&logits, (size_t)32 * c->vocab_size * sizeof(float)));

    /* decode: bytes a step must read = every weight matrix once (embedding: only its rows),
     * the norms (negligible), and the KV of every position seen */
    const int batch[2] = {1, 32};
    for (int i = 0; i < 2; i++) {
        int64_t kv_bytes = 0;
        double gpu_s = 0;
        double dt = decode(be, ex, batch[i], logits,
                           pp_kv_block_bytes(LAYERS, (int32_t)kv_dim, 1), &kv_bytes, &gpu_s);
        f.decode_gpu_ms[i] = gpu_s * 1e3;
        double bytes = (double)weight_bytes + (double)kv_bytes + batch[i] * (double)c->dim * 2;
        f.decode_ms[i] = dt * 1e3;
        f.decode_tok_s[i] = batch[i] / dt;
        f.decode_gbps[i] = bytes / dt / 1e9;
        f.decode_frac[i] = f.decode_gbps[i] / f.copy_gbps;
        printf("decode batch %2d at context %d: %.3f ms/step, %.0f tokens/s, %.1f GB/s = %.2f of "
               "copy bandwidth (GPU time %.3f ms)\n", batch[i], DECODE_CONTEXT, f.decode_ms[i],
               f.decode_tok_s[i], f.decode_gbps[i], f.decode_frac[i], f.decode_gpu_ms[i]);
        write_json(&f);
    }

    /* prefill: 2 x params x tokens for the matmuls, 4 x heads x head_dim x (causal pairs) for the
     * attention, and one LM-head row */
    double head_params = (double)c->vocab_size * c->dim;
    double layer_params = (double)weight_bytes / 2 - head_params;
    double pairs = (double)PREFILL_TOKENS * (PREFILL_TOKENS + 1) / 2;
    double flops = 2.0 * layer_params * PREFILL_TOKENS +
                   4.0 * c->n_heads * c->head_dim * pairs * LAYERS + 2.0 * head_params;
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = pp_clock_mono();
        prefill(ex, 1, PREFILL_TOKENS, 5000, logits);
        double dt = pp_clock_mono() - t0;
        release(ex, 1, 5000);
        if (rep >= 1 && dt < best)
            best = dt;
    }
    f.prefill_ms = best * 1e3;
    best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        CKP("sync", be->ops->sync(be));
        double t0 = pp_clock_mono();
        pp_cuda_delay(be, 50000);
        prefill(ex, 1, PREFILL_TOKENS, 5000, logits);
        double dt = pp_clock_mono() - t0 - 0.050;
        release(ex, 1, 5000);
        if (dt < best)
            best = dt;
    }
    f.prefill_gpu_ms = best * 1e3;
    f.prefill_matmul_ms = prefill_matmuls(be, layers) * 1e3;
    f.prefill_tflops = flops / best / 1e12;
    f.prefill_frac = f.prefill_tflops / f.cublas_tflops;
    printf("prefill %d tokens: %.2f ms, %.1f TFLOP/s = %.2f of cuBLAS's GEMM rate\n",
           PREFILL_TOKENS, f.prefill_ms, f.prefill_tflops, f.prefill_frac);
    printf("prefill's GPU time %.2f ms, its matmuls alone %.2f ms\n", f.prefill_gpu_ms,
           f.prefill_matmul_ms);
    write_json(&f);
    const int32_t lo_n[2] = {PREFILL_TOKENS, 1}, lo_pos[2] = {0, DECODE_CONTEXT};
    for (int i = 0; i < 2; i++) {
        double at, sm;
        layer_ops(be, &m, lo_n[i], lo_pos[i], &at, &sm);
        f.attn_ms[i] = at * 1e3;
        f.small_ms[i] = sm * 1e3;
        printf("one layer, %d token(s) at position %d: attention %.4f ms, the other small ops "
               "%.4f ms\n", lo_n[i], lo_pos[i], f.attn_ms[i], f.small_ms[i]);
    }
    write_json(&f);
    const struct pp_weight *gw[4] = {&m.lm_head, &layers[0].w_gate, &layers[0].wq,
                                     &layers[0].wk};
    for (int i = 0; i < 4; i++) {
        f.gemv_gbps[i] = gemv_rate(be, gw[i]);
        printf("GEMV %s [%lld, %lld] alone: %.1f GB/s of weights = %.2f of copy bandwidth\n",
               gemv_names[i], (long long)gw[i]->rows, (long long)gw[i]->cols, f.gemv_gbps[i],
               f.gemv_gbps[i] / f.copy_gbps);
    }
    write_json(&f);

    pp_executor_free(ex);
    CK(cudaFreeHost(logits));
    be->ops->free(be); /* the weights go with the context */
    return 0;
}
