/* pp_bench: the CPU backend at the machine's limits, on the tinyllama shape.
 *
 *   pp_bench [--threads N] [--models DIR] [--dtypes f16,bf16,q8_0] [--prompt N] [--decode N]
 *            [--decode-batch B] [--batch-prompt P] [--json PATH]
 *
 * Measures, in one run: the machine's read bandwidth and FP32 FMA peak with N threads (with the
 * widest vectors the CPU has, AVX-512 where present; before and after the models; the better of
 * the two is the bound); then per weight dtype (models DIR/<dtype>/model.gguf, written by the
 * synth API when missing) the prefill rate of one prompt and the greedy decode rate after it, the
 * bytes a decode step reads, decode as a fraction of the bandwidth bound and prefill as a fraction
 * of the FMA peak; and our f32 matmul against OpenBLAS cblas_sgemm on the model's shapes, one
 * token and a prompt's worth.
 * --decode-batch B (B >= 2) adds, per dtype, decode steps of B sequences together (a small
 * microbatch: B tokens per step, each sequence after a prompt of P tokens, --batch-prompt, 16 by
 * default): tokens/s, and the weights streamed per second (weight bytes of a step ÷ the median
 * step), which shows how well the matmul serves B tokens from one read of the weights; a long P
 * shows what attention over B long contexts adds to a step. Last per dtype, decode steps
 * alternating between weights copied into huge-page memory (the default) and weights mapped from
 * the file: the ratio of their median steps. The main figures use the default (copied).
 *
 * The bandwidth of a shared machine drifts (neighbours on the host take and give back memory
 * bandwidth: we have seen 35 and 50 GB/s minutes apart), so the bound measured before and after
 * can belong to another moment than the decode steps. Each dtype therefore also runs "decode
 * beside the bandwidth": decode steps alternating with single read passes over a 256 MiB buffer
 * (one stream per thread, then four); a step's bound is the better of the passes just before and
 * after it, its fraction is its bytes per second over that bound, and the figure is the median
 * fraction. Both figures are printed and written. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/bench.h"
#include "common/alloc.h"
#include "common/json_write.h"
#include "common/limits.h"
#include "kernels/cpu/simd.h"
#include "model/executor.h"
#include "model/model.h"
#include "model/synth.h"

struct opts {
    int threads;
    const char *models;
    char dtypes[64];
    int prompt;
    int decode;
    int decode_batch; /* 0: none */
    int batch_prompt; /* each batched sequence's prompt */
    const char *json;
};

struct dtype_result {
    const char *dtype;
    double prefill_tok_s;
    double decode_tok_s;      /* from the median step */
    double decode_mean_tok_s; /* from the mean step */
    double decode_best_tok_s; /* from the fastest step (as the bounds: best of several) */
    double decode_bytes_per_token;
    double prefill_flops_per_token;
    double decode_frac_bw;
    double decode_best_frac_bw;
    double prefill_frac_peak;
    double batch_step_s;        /* median step of decode_batch sequences; 0 when not run */
    double batch_weight_bytes;  /* weight bytes one step reads (matrices, LM head) */
    double batch_frac_bw;       /* weight bytes per second ÷ read bandwidth */
    double copy_step_s;         /* median decode step, weights copied (interleaved with map) */
    double map_step_s;          /* median decode step, weights mapped from the file */
    double copy_prefill_s;      /* best prefill of the prompt, weights copied (alternating) */
    double map_prefill_s;       /* the same, weights mapped */
    double beside_frac_bw;      /* median over steps of bytes/s ÷ the passes beside the step */
    double beside_bw;           /* median of the steps' bounds */
    double beside_tok_s;        /* from the median of those steps */
};

static int usage(void)
{
    fprintf(stderr, "usage: pp_bench [--threads N] [--models DIR] [--dtypes f16,bf16,q8_0] "
                    "[--prompt N] [--decode N] [--decode-batch B] [--batch-prompt P] "
                    "[--json PATH]\n");
    return 2;
}


static int64_t weight_bytes(const struct pp_weight *w)
{
    return w->rows * pp_dtype_row_bytes(w->dtype, w->cols);
}

/* Bytes one decode step at context ctx reads: every matrix, the norms, one embedding row, and the
 * KV cache of every layer up to ctx. */
static double decode_bytes(const struct pp_model *m, double ctx)
{
    const struct pp_model_config *c = &m->cfg;
    double b = 0.0;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const struct pp_layer_weights *lw = &m->layers[l];
        b += (double)(weight_bytes(&lw->wq) + weight_bytes(&lw->wk) + weight_bytes(&lw->wv) +
                      weight_bytes(&lw->wo) + weight_bytes(&lw->w_gate) + weight_bytes(&lw->w_up) +
                      weight_bytes(&lw->w_down));
        b += 2.0 * c->dim * 4;
    }
    b += (double)weight_bytes(&m->lm_head) + c->dim * 4.0;
    b += (double)pp_dtype_row_bytes(m->embedding.dtype, m->embedding.cols);
    b += (double)c->n_layers * 2.0 * ctx * c->n_kv_heads * c->head_dim * 4.0;
    return b;
}

/* Weight bytes every decode step reads whatever its batch: the layer matrices and the LM head. */
static double step_weight_bytes(const struct pp_model *m)
{
    double b = (double)weight_bytes(&m->lm_head);
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        const struct pp_layer_weights *lw = &m->layers[l];
        b += (double)(weight_bytes(&lw->wq) + weight_bytes(&lw->wk) + weight_bytes(&lw->wv) +
                      weight_bytes(&lw->wo) + weight_bytes(&lw->w_gate) + weight_bytes(&lw->w_up) +
                      weight_bytes(&lw->w_down));
    }
    return b;
}

/* Decode steps of o->decode_batch sequences together after an o->batch_prompt-token prompt each:
 * the median step time into r. */
static pp_status run_batch(const struct opts *o, struct pp_executor *ex, const struct pp_model *m,
                           struct dtype_result *r)
{
    int nb = o->decode_batch;
    const struct pp_model_config *c = &m->cfg;
    struct pp_exec_seq *seqs = malloc(sizeof(*seqs) * (size_t)nb);
    int bp = o->batch_prompt;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)nb * (size_t)bp);
    float *logits = malloc(sizeof(float) * (size_t)nb * (size_t)c->vocab_size);
    double *steps = malloc(sizeof(double) * (size_t)o->decode);
    pp_status st = PP_OK;
    if (!seqs || !toks || !logits || !steps) {
        st = PP_ERR_NOMEM;
        goto out;
    }
    for (int i = 0; i < nb; i++) {
        seqs[i] = (struct pp_exec_seq){100 + (uint64_t)i, 0, bp, 1};
        for (int k = 0; k < bp; k++)
            toks[(size_t)i * bp + k] = (int32_t)((i * 131 + k * 7919 + 17) % c->vocab_size);
    }
    struct pp_exec_batch b = {nb, seqs, toks, NULL};
    if ((st = pp_executor_forward(ex, &b, NULL, logits)) != PP_OK)
        goto out;
    for (int s = 0; s < o->decode; s++) {
        for (int i = 0; i < nb; i++) {
            seqs[i].pos += seqs[i].n_tokens;
            seqs[i].n_tokens = 1;
            toks[i] = pp_bench_argmax(logits + (size_t)i * (size_t)c->vocab_size, c->vocab_size);
        }
        double t0 = pp_bench_now();
        if ((st = pp_executor_forward(ex, &b, NULL, logits)) != PP_OK)
            goto out;
        steps[s] = pp_bench_now() - t0;
    }
    qsort(steps, (size_t)o->decode, sizeof(double), pp_bench_cmp_double);
    r->batch_step_s = steps[o->decode / 2];
    r->batch_weight_bytes = step_weight_bytes(m);
out:
    if (seqs)
        for (int i = 0; i < nb; i++)
            pp_executor_release(ex, 100 + (uint64_t)i);
    free(seqs);
    free(toks);
    free(logits);
    free(steps);
    return st;
}

/* FLOPs of a prompt of n tokens: every layer matrix per token, attention over the causal
 * prefix, and the LM head for the last token. */
static double prefill_flops(const struct pp_model *m, int n)
{
    const struct pp_model_config *c = &m->cfg;
    double per_tok = 0.0;
    const struct pp_layer_weights *lw = &m->layers[0];
    const struct pp_weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up,
                                    &lw->w_down};
    for (int i = 0; i < 7; i++)
        per_tok += 2.0 * (double)ws[i]->rows * (double)ws[i]->cols;
    double attn = 0.0;
    for (int p = 0; p < n; p++)
        attn += 4.0 * c->n_heads * c->head_dim * (p + 1.0);
    return c->n_layers * (per_tok * n + attn) + 2.0 * c->vocab_size * c->dim;
}

static pp_status ensure_model(const char *dir, const char *dtype, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s/model.gguf", dir, dtype);
    struct stat st;
    if (stat(path, &st) == 0)
        return PP_OK;
    char sub[4096];
    snprintf(sub, sizeof(sub), "%s/%s", dir, dtype);
    mkdir(dir, 0755);
    if (mkdir(sub, 0755) != 0 && errno != EEXIST)
        return pp_error(PP_ERR_IO, "cannot create %s", sub);
    struct pp_synth_spec spec;
    pp_status s = pp_synth_shape("tinyllama", &spec);
    if (s != PP_OK)
        return s;
    spec.dtype = (enum pp_dtype)pp_dtype_parse(dtype);
    fprintf(stderr, "writing %s ...\n", path);
    return pp_synth_write_gguf(&spec, path);
}

/* Where the CPU backend's weights live: one executor computing from weights copied into huge-page
 * memory (the default) and one from the mapped model file, decoding in alternation after an
 * 8-token prompt (which of the two goes first alternates too), so that both medians come from
 * the same minutes of this shared machine; then PLACEMENT_PREFILLS prefills of the o->prompt
 * tokens on each in alternation, the best of each. */
#define PLACEMENT_PREFILLS 3
/* Timed prefill passes of the main figure, after one warm-up pass; the best counts. */
#define PREFILL_PASSES 4
static pp_status run_placement(const struct opts *o, const struct pp_model *m,
                               struct dtype_result *r)
{
    enum { PROMPT = 8 };
    const struct pp_model_config *c = &m->cfg;
    struct pp_backend *be[2] = {NULL, NULL};
    struct pp_executor *ex[2] = {NULL, NULL};
    double *steps = malloc(2 * (size_t)o->decode * sizeof(double));
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    pp_status st = steps && logits ? PP_OK : PP_ERR_NOMEM;
    int n_ids = o->prompt > PROMPT ? o->prompt : PROMPT;
    int32_t *ids = malloc((size_t)n_ids * sizeof(int32_t));
    int32_t tok[2];
    if (!ids)
        st = PP_ERR_NOMEM;
    for (int i = 0; ids && i < n_ids; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    for (int k = 0; k < 2 && st == PP_OK; k++) {
        if ((st = pp_backend_cpu_new(o->threads, &be[k])) != PP_OK)
            break;
        pp_backend_cpu_map_weights(be[k], k == 1);
        struct pp_executor_opts eo = {0};
        eo.max_seqs = 2;
        eo.max_context = (PROMPT + o->decode > o->prompt ? PROMPT + o->decode : o->prompt) + 8;
        if ((st = pp_executor_new(m, be[k], &eo, &ex[k])) != PP_OK)
            break;
        struct pp_exec_seq seq = {1, 0, PROMPT, 1};
        struct pp_exec_batch b = {1, &seq, ids, NULL};
        if ((st = pp_executor_forward(ex[k], &b, NULL, logits)) != PP_OK)
            break;
        tok[k] = pp_bench_argmax(logits, c->vocab_size);
    }
    for (int i = 0; i < o->decode && st == PP_OK; i++)
        for (int h = 0; h < 2 && st == PP_OK; h++) {
            int k = (i + h) % 2;
            struct pp_exec_seq seq = {1, PROMPT + i, 1, 1};
            struct pp_exec_batch b = {1, &seq, &tok[k], NULL};
            double t0 = pp_bench_now();
            st = pp_executor_forward(ex[k], &b, NULL, logits);
            steps[k * o->decode + i] = pp_bench_now() - t0;
            tok[k] = pp_bench_argmax(logits, c->vocab_size);
        }
    if (st == PP_OK) {
        for (int k = 0; k < 2; k++)
            qsort(steps + k * o->decode, (size_t)o->decode, sizeof(double), pp_bench_cmp_double);
        r->copy_step_s = steps[o->decode / 2];
        r->map_step_s = steps[o->decode + o->decode / 2];
    }
    double best[2] = {1e30, 1e30};
    for (int i = 0; i < PLACEMENT_PREFILLS && st == PP_OK; i++)
        for (int h = 0; h < 2 && st == PP_OK; h++) {
            int k = (i + h) % 2;
            struct pp_exec_seq seq = {2, 0, o->prompt, 1};
            struct pp_exec_batch b = {1, &seq, ids, NULL};
            pp_executor_release(ex[k], 2);
            double t0 = pp_bench_now();
            st = pp_executor_forward(ex[k], &b, NULL, logits);
            double t = pp_bench_now() - t0;
            if (t < best[k])
                best[k] = t;
        }
    if (st == PP_OK) {
        r->copy_prefill_s = best[0];
        r->map_prefill_s = best[1];
    }
    for (int k = 0; k < 2; k++) {
        pp_executor_free(ex[k]);
        if (be[k])
            be[k]->ops->free(be[k]);
    }
    free(steps);
    free(logits);
    free(ids);
    return st;
}

#define BESIDE_BW_BYTES ((size_t)256 << 20)

/* Decode beside the bandwidth (see the top of the file): o->decode steps of sequence 1 from
 * position pos, each between two single read passes. */
static pp_status run_beside(const struct opts *o, struct pp_executor *ex, const struct pp_model *m,
                            int32_t tok, int64_t pos, float *logits, struct dtype_result *r)
{
    int n = o->decode;
    struct pp_bench_bw *probe = pp_bench_bw_new(BESIDE_BW_BYTES);
    double *pass = malloc(sizeof(double) * (size_t)(n + 1));
    double *step = malloc(sizeof(double) * (size_t)n);
    double *frac = malloc(sizeof(double) * (size_t)n);
    double *bound = malloc(sizeof(double) * (size_t)n);
    pp_status st = PP_OK;
    if (!probe || !pass || !step || !frac || !bound) {
        st = PP_ERR_NOMEM;
        goto out;
    }
    pass[0] = pp_bench_bw_pass(probe, o->threads, 1);
    for (int i = 0; i < n && st == PP_OK; i++) {
        struct pp_exec_seq seq = {1, pos + i, 1, 1};
        struct pp_exec_batch b = {1, &seq, &tok, NULL};
        double t0 = pp_bench_now();
        st = pp_executor_forward(ex, &b, NULL, logits);
        step[i] = pp_bench_now() - t0;
        tok = pp_bench_argmax(logits, m->cfg.vocab_size);
        pass[i + 1] = pp_bench_bw_pass(probe, o->threads, (i + 1) % 2 ? 4 : 1);
    }
    if (st != PP_OK)
        goto out;
    for (int i = 0; i < n; i++) {
        bound[i] = pass[i] > pass[i + 1] ? pass[i] : pass[i + 1];
        frac[i] = decode_bytes(m, (double)(pos + i)) / step[i] / bound[i];
    }
    qsort(frac, (size_t)n, sizeof(double), pp_bench_cmp_double);
    qsort(bound, (size_t)n, sizeof(double), pp_bench_cmp_double);
    qsort(step, (size_t)n, sizeof(double), pp_bench_cmp_double);
    r->beside_frac_bw = frac[n / 2];
    r->beside_bw = bound[n / 2];
    r->beside_tok_s = 1.0 / step[n / 2];
out:
    pp_bench_bw_free(probe);
    free(pass);
    free(step);
    free(frac);
    free(bound);
    return st;
}

static pp_status run_dtype(const struct opts *o, const char *dtype, struct dtype_result *r)
{
    char path[4096];
    pp_status st = ensure_model(o->models, dtype, path, sizeof(path));
    if (st != PP_OK)
        return st;
    struct pp_model *m = NULL;
    struct pp_backend *be = NULL;
    struct pp_executor *ex = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    double *steps = NULL;
    if ((st = pp_model_open(path, 0, -1, &m)) != PP_OK)
        return st;
    if ((st = pp_backend_cpu_new(o->threads, &be)) != PP_OK)
        goto out;
    struct pp_executor_opts eo = {0};
    eo.max_seqs = 2 + o->decode_batch;
    /* the decode steps, then those beside; the batch's prompts and steps */
    int need = o->prompt + 2 * o->decode + 8;
    if (o->decode_batch > 0 && o->batch_prompt + o->decode + 8 > need)
        need = o->batch_prompt + o->decode + 8;
    eo.max_context = need;
    if ((st = pp_executor_new(m, be, &eo, &ex)) != PP_OK)
        goto out;
    if (pp_executor_max_context(ex) < need) {
        if (o->decode_batch > 0)
            st = pp_error(PP_ERR_INVALID_ARG,
                          "the model holds %d positions; --prompt %d, --batch-prompt %d and "
                          "--decode %d need %d (the prompt and its decode steps twice, or a "
                          "batched prompt and its steps, and 8 spare)",
                          pp_executor_max_context(ex), o->prompt, o->batch_prompt, o->decode,
                          need);
        else
            st = pp_error(PP_ERR_INVALID_ARG,
                          "the model holds %d positions; --prompt %d and --decode %d need %d (the "
                          "prompt, its decode steps, as many beside the bandwidth, and 8 spare)",
                          pp_executor_max_context(ex), o->prompt, o->decode, need);
        goto out;
    }
    const struct pp_model_config *c = &m->cfg;
    logits = malloc((size_t)c->vocab_size * sizeof(float));
    ids = malloc((size_t)o->prompt * sizeof(int32_t));
    steps = malloc((size_t)o->decode * sizeof(double));
    if (!logits || !ids || !steps) {
        st = PP_ERR_NOMEM;
        goto out;
    }
    for (int i = 0; i < o->prompt; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);

    /* prefill: a warm-up pass (maps the weights in), then the best of PREFILL_PASSES timed
     * passes (two had let one slow moment of the shared host take both: f16 at 59.6% of the FMA
     * peak in one run, while its placement prefills beside it ran at 70%) */
    double best_prefill = 1e30;
    for (int pass = 0; pass <= PREFILL_PASSES; pass++) {
        struct pp_exec_seq seq = {1, 0, o->prompt, 1};
        struct pp_exec_batch b = {1, &seq, ids, NULL};
        pp_executor_release(ex, 1);
        double t0 = pp_bench_now();
        if ((st = pp_executor_forward(ex, &b, NULL, logits)) != PP_OK)
            goto out;
        double t = pp_bench_now() - t0;
        if (pass > 0 && t < best_prefill)
            best_prefill = t;
    }
    /* decode greedily from the prompt; the median step resists the odd preempted step on a shared
     * machine, the mean is reported beside it */
    int32_t tok = pp_bench_argmax(logits, c->vocab_size);
    double total = 0.0;
    for (int i = 0; i < o->decode; i++) {
        struct pp_exec_seq seq = {1, o->prompt + i, 1, 1};
        struct pp_exec_batch b = {1, &seq, &tok, NULL};
        double t0 = pp_bench_now();
        if ((st = pp_executor_forward(ex, &b, NULL, logits)) != PP_OK)
            goto out;
        steps[i] = pp_bench_now() - t0;
        total += steps[i];
        tok = pp_bench_argmax(logits, c->vocab_size);
    }
    qsort(steps, (size_t)o->decode, sizeof(double), pp_bench_cmp_double);
    r->dtype = dtype;
    r->prefill_tok_s = o->prompt / best_prefill;
    r->decode_tok_s = 1.0 / steps[o->decode / 2];
    r->decode_mean_tok_s = o->decode / total;
    r->decode_best_tok_s = 1.0 / steps[0];
    r->decode_bytes_per_token = decode_bytes(m, o->prompt + o->decode / 2.0);
    r->prefill_flops_per_token = prefill_flops(m, o->prompt) / o->prompt;
    r->batch_step_s = 0.0;
    st = run_beside(o, ex, m, tok, o->prompt + o->decode, logits, r);
    if (st == PP_OK && o->decode_batch > 0)
        st = run_batch(o, ex, m, r);
    if (st == PP_OK) {
        pp_executor_free(ex); /* its copy of the weights is not needed for the comparison */
        ex = NULL;
        st = run_placement(o, m, r);
    }
out:
    free(logits);
    free(ids);
    free(steps);
    pp_executor_free(ex);
    if (be)
        be->ops->free(be);
    pp_model_free(m);
    return st;
}

static int parse(int argc, char **argv, struct opts *o)
{
    o->threads = 2;
    o->models = "/tmp/pp_bench_models";
    snprintf(o->dtypes, sizeof(o->dtypes), "f16,bf16,q8_0");
    o->prompt = 128;
    o->decode = 32;
    o->decode_batch = 0;
    o->batch_prompt = 16;
    o->json = NULL;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return -1;
        if (strcmp(a, "--threads") == 0)
            o->threads = atoi(v);
        else if (strcmp(a, "--models") == 0)
            o->models = v;
        else if (strcmp(a, "--dtypes") == 0)
            snprintf(o->dtypes, sizeof(o->dtypes), "%s", v);
        else if (strcmp(a, "--prompt") == 0)
            o->prompt = atoi(v);
        else if (strcmp(a, "--decode") == 0)
            o->decode = atoi(v);
        else if (strcmp(a, "--decode-batch") == 0)
            o->decode_batch = atoi(v);
        else if (strcmp(a, "--batch-prompt") == 0)
            o->batch_prompt = atoi(v);
        else if (strcmp(a, "--json") == 0)
            o->json = v;
        else
            return -1;
    }
    return o->threads >= 1 && o->prompt >= 1 && o->decode >= 1 && o->batch_prompt >= 1 &&
                   (o->decode_batch == 0 || (o->decode_batch >= 2 && o->decode_batch <= 64))
               ? 0
               : -1;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse(argc, argv, &o) != 0)
        return usage();

    printf("pp_bench: %d threads, tinyllama, prompt %d, decode %d\n", o.threads, o.prompt,
           o.decode);
    /* threads beyond the usable CPUs share them: the peak and the kernels would measure that */
    struct pp_cpus cpus;
    char cpu_line[1024], cpu_warn[1024];
    pp_cpus_read(&cpus);
    pp_cpus_describe(&cpus, cpu_line, sizeof(cpu_line));
    pp_cpus_threads(&cpus, o.threads, cpu_warn, sizeof(cpu_warn));
    char cpu_name[160];
    pp_bench_cpu_name(cpu_name, sizeof(cpu_name));
    printf("cpu: %s\n", cpu_name);
    printf("cpus: %s\n", cpu_line);
    if (cpu_warn[0])
        printf("warning: %s\n", cpu_warn);
    /* the machine's limits, measured now and again after the models; the best of the two is the
     * bound (a busy neighbour can only lower a measurement) */
    double load0 = pp_bench_loadavg();
    double bw = pp_bench_read_bandwidth(o.threads);
    double peak = pp_bench_fma_peak(o.threads);
    printf("machine: read bandwidth %.2f GB/s, FP32 FMA peak %.1f GFLOP/s (%s; load average "
           "%.2f)\nkernels: %s\n",
           bw / 1e9, peak / 1e9, pp_bench_fma_isa(), load0, pp_simd_get()->name);

    struct dtype_result res[8];
    int n_res = 0;
    char list[64];
    snprintf(list, sizeof(list), "%s", o.dtypes);
    for (char *save = NULL, *d = strtok_r(list, ",", &save); d && n_res < 8;
         d = strtok_r(NULL, ",", &save)) {
        if (pp_dtype_parse(d) < 0) {
            fprintf(stderr, "unknown dtype %s\n", d);
            return 2;
        }
        pp_status st = run_dtype(&o, d, &res[n_res]);
        if (st != PP_OK) {
            fprintf(stderr, "%s: %s: %s\n", d, pp_strerror(st), pp_error_detail());
            return 1;
        }
        res[n_res].dtype = strstr(o.dtypes, d); /* points into o, which outlives res */
        n_res++;
    }

    double bw2 = pp_bench_read_bandwidth(o.threads), peak2 = pp_bench_fma_peak(o.threads);
    double load1 = pp_bench_loadavg();
    printf("machine again: read bandwidth %.2f GB/s, FP32 FMA peak %.1f GFLOP/s (load average "
           "%.2f)\n", bw2 / 1e9, peak2 / 1e9, load1);
    double bw_best = bw2 > bw ? bw2 : bw, peak_best = peak2 > peak ? peak2 : peak;
    for (int i = 0; i < n_res; i++) {
        struct dtype_result *r = &res[i];
        r->decode_frac_bw = bw_best > 0 ? r->decode_tok_s * r->decode_bytes_per_token / bw_best : 0;
        r->decode_best_frac_bw =
            bw_best > 0 ? r->decode_best_tok_s * r->decode_bytes_per_token / bw_best : 0;
        r->prefill_frac_peak =
            peak_best > 0 ? r->prefill_tok_s * r->prefill_flops_per_token / peak_best : 0;
        r->batch_frac_bw = bw_best > 0 && r->batch_step_s > 0
                               ? r->batch_weight_bytes / r->batch_step_s / bw_best
                               : 0;
    }

    /* f32 matmul vs OpenBLAS on the tinyllama shapes */
    static const struct pp_bench_shape shapes[] = {
        {"wq/wo 2048x2048", 2048, 2048}, {"wk/wv 256x2048", 256, 2048},
        {"gate/up 5632x2048", 5632, 2048}, {"down 2048x5632", 2048, 5632}};
    const int64_t ns[] = {1, o.prompt};
    double ours[2][4], blas[2][4], ours_sum[2] = {0, 0}, blas_sum[2] = {0, 0};
    struct pp_backend *be;
    if (pp_backend_cpu_new(o.threads, &be) != PP_OK || be->ops->reserve(be, 8192, 16) != PP_OK)
        return 1;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) {
            ours[k][i] = pp_bench_matmul_time(be, o.threads, &shapes[i], ns[k]);
            ours_sum[k] += ours[k][i];
        }
    be->ops->free(be);
    int have_blas = pp_bench_have_openblas();
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) {
            blas[k][i] = have_blas ? pp_bench_matmul_time(NULL, o.threads, &shapes[i], ns[k]) : 0;
            blas_sum[k] += blas[k][i];
        }

    printf("\nbounds: read bandwidth %.2f GB/s, FMA peak %.1f GFLOP/s (best of both "
           "measurements)\n", bw_best / 1e9, peak_best / 1e9);
    printf("%-6s %12s %7s %7s %9s %12s %12s %13s %12s\n", "dtype", "decode tok/s", "(mean)",
           "(best)", "MB/token", "decode/bound", "(best step)", "prefill tok/s", "prefill/peak");
    for (int i = 0; i < n_res; i++) {
        const struct dtype_result *r = &res[i];
        int len = (int)strcspn(r->dtype, ",");
        printf("%-6.*s %12.2f %7.2f %7.2f %9.1f %11.1f%% %11.1f%% %13.1f %11.1f%%\n", len,
               r->dtype, r->decode_tok_s, r->decode_mean_tok_s, r->decode_best_tok_s,
               r->decode_bytes_per_token / 1e6, 100 * r->decode_frac_bw,
               100 * r->decode_best_frac_bw, r->prefill_tok_s, 100 * r->prefill_frac_peak);
    }
    printf("\ndecode beside the bandwidth: %d steps, each between two single read passes; a step's "
           "bound is the better pass beside it\n", o.decode);
    printf("%-6s %12s %14s %14s\n", "dtype", "decode tok/s", "bound GB/s", "decode/bound");
    for (int i = 0; i < n_res; i++) {
        const struct dtype_result *r = &res[i];
        int len = (int)strcspn(r->dtype, ",");
        printf("%-6.*s %12.2f %14.2f %13.1f%%\n", len, r->dtype, r->beside_tok_s,
               r->beside_bw / 1e9, 100 * r->beside_frac_bw);
    }
    printf("\nweights copied into huge-page memory (the default) vs mapped from the file: decode "
           "steps in alternation, 8-token prompt, median of %d each; then %d-token prefills in "
           "alternation, best of %d each\n", o.decode, o.prompt, PLACEMENT_PREFILLS);
    printf("%-6s %12s %12s %10s %14s %14s %10s\n", "dtype", "copy ms", "map ms", "map/copy",
           "prefill copy", "prefill map", "map/copy");
    for (int i = 0; i < n_res; i++) {
        const struct dtype_result *r = &res[i];
        int len = (int)strcspn(r->dtype, ",");
        printf("%-6.*s %12.2f %12.2f %10.3f %14.1f %14.1f %10.3f\n", len, r->dtype,
               r->copy_step_s * 1e3, r->map_step_s * 1e3,
               r->copy_step_s > 0 ? r->map_step_s / r->copy_step_s : 0.0,
               r->copy_prefill_s * 1e3, r->map_prefill_s * 1e3,
               r->copy_prefill_s > 0 ? r->map_prefill_s / r->copy_prefill_s : 0.0);
    }
    if (o.decode_batch > 0) {
        printf("\ndecode steps of %d sequences together (prompt %d each, median of %d steps)\n",
               o.decode_batch, o.batch_prompt, o.decode);
        printf("%-6s %12s %12s %13s %14s\n", "dtype", "step ms", "tok/s", "weights GB/s",
               "weights/bound");
        for (int i = 0; i < n_res; i++) {
            const struct dtype_result *r = &res[i];
            int len = (int)strcspn(r->dtype, ",");
            printf("%-6.*s %12.1f %12.2f %13.2f %13.1f%%\n", len, r->dtype, r->batch_step_s * 1e3,
                   o.decode_batch / r->batch_step_s, r->batch_weight_bytes / r->batch_step_s / 1e9,
                   100 * r->batch_frac_bw);
        }
    }
    if (have_blas)
        printf("\nf32 matmul, ours vs cblas_sgemm (time ratio blas/ours; > 1: ours faster)\n");
    else
        printf("\nf32 matmul, ours alone: this build has no OpenBLAS (pkg-config found no "
               "openblas when it was configured; scripts/install-deps.sh installs "
               "libopenblas-dev, then configure again), so no cblas_sgemm comparison\n");
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 4; i++) {
            printf("  n=%-4lld %-20s ours %8.3f ms (%6.1f GFLOP/s)", (long long)ns[k],
                   shapes[i].name, ours[k][i] * 1e3,
                   2.0 * shapes[i].rows * shapes[i].cols * ns[k] / ours[k][i] / 1e9);
            if (have_blas)
                printf("  blas %8.3f ms  ratio %.2f", blas[k][i] * 1e3,
                       ours[k][i] > 0 ? blas[k][i] / ours[k][i] : 0.0);
            printf("\n");
        }
        if (have_blas)
            printf("  n=%-4lld all four shapes: ratio %.2f\n", (long long)ns[k],
                   ours_sum[k] > 0 ? blas_sum[k] / ours_sum[k] : 0.0);
    }

    if (o.json) {
        struct pp_json j;
        pp_json_init(&j);
        pp_json_begin_object(&j);
        pp_json_key(&j, "threads");
        pp_json_int(&j, o.threads);
        pp_json_key(&j, "usable_cpus");
        pp_json_int(&j, cpus.usable);
        pp_json_key(&j, "cpu");
        pp_json_cstring(&j, cpu_name);
        pp_json_key(&j, "shape");
        pp_json_cstring(&j, "tinyllama");
        pp_json_key(&j, "prompt_tokens");
        pp_json_int(&j, o.prompt);
        pp_json_key(&j, "decode_tokens");
        pp_json_int(&j, o.decode);
        pp_json_key(&j, "read_bandwidth_bytes_s");
        pp_json_double(&j, bw_best);
        pp_json_key(&j, "fma_peak_flops");
        pp_json_double(&j, peak_best);
        pp_json_key(&j, "fma_peak_isa");
        pp_json_cstring(&j, pp_bench_fma_isa());
        pp_json_key(&j, "kernels");
        pp_json_cstring(&j, pp_simd_get()->name);
        pp_bench_json_pair(&j, "read_bandwidth_bytes_s_measurements", bw, bw2);
        pp_bench_json_pair(&j, "fma_peak_flops_measurements", peak, peak2);
        pp_bench_json_pair(&j, "load_average", load0, load1);
        pp_json_key(&j, "models");
        pp_json_begin_array(&j);
        for (int i = 0; i < n_res; i++) {
            const struct dtype_result *r = &res[i];
            pp_json_begin_object(&j);
            pp_json_key(&j, "dtype");
            pp_json_string(&j, r->dtype, strcspn(r->dtype, ","));
            pp_json_key(&j, "decode_tok_s");
            pp_json_double(&j, r->decode_tok_s);
            pp_json_key(&j, "decode_step_s_weights_copied");
            pp_json_double(&j, r->copy_step_s);
            pp_json_key(&j, "decode_step_s_weights_mapped");
            pp_json_double(&j, r->map_step_s);
            pp_json_key(&j, "decode_mapped_over_copied");
            pp_json_double(&j, r->copy_step_s > 0 ? r->map_step_s / r->copy_step_s : 0.0);
            pp_json_key(&j, "prefill_s_weights_copied");
            pp_json_double(&j, r->copy_prefill_s);
            pp_json_key(&j, "prefill_s_weights_mapped");
            pp_json_double(&j, r->map_prefill_s);
            pp_json_key(&j, "prefill_mapped_over_copied");
            pp_json_double(&j, r->copy_prefill_s > 0 ? r->map_prefill_s / r->copy_prefill_s : 0.0);
            pp_json_key(&j, "decode_mean_tok_s");
            pp_json_double(&j, r->decode_mean_tok_s);
            pp_json_key(&j, "decode_best_step_tok_s");
            pp_json_double(&j, r->decode_best_tok_s);
            pp_json_key(&j, "decode_best_step_fraction_of_bandwidth_bound");
            pp_json_double(&j, r->decode_best_frac_bw);
            pp_json_key(&j, "decode_bytes_per_token");
            pp_json_double(&j, r->decode_bytes_per_token);
            pp_json_key(&j, "decode_fraction_of_bandwidth_bound");
            pp_json_double(&j, r->decode_frac_bw);
            pp_json_key(&j, "decode_beside_bandwidth");
            pp_json_begin_object(&j);
            pp_json_key(&j, "tok_s");
            pp_json_double(&j, r->beside_tok_s);
            pp_json_key(&j, "bound_bytes_s_median");
            pp_json_double(&j, r->beside_bw);
            pp_json_key(&j, "fraction_of_bound_median");
            pp_json_double(&j, r->beside_frac_bw);
            pp_json_end_object(&j);
            pp_json_key(&j, "prefill_tok_s");
            pp_json_double(&j, r->prefill_tok_s);
            pp_json_key(&j, "prefill_flops_per_token");
            pp_json_double(&j, r->prefill_flops_per_token);
            pp_json_key(&j, "prefill_fraction_of_fma_peak");
            pp_json_double(&j, r->prefill_frac_peak);
            if (o.decode_batch > 0) {
                pp_json_key(&j, "decode_batch");
                pp_json_begin_object(&j);
                pp_json_key(&j, "sequences");
                pp_json_int(&j, o.decode_batch);
                pp_json_key(&j, "prompt_tokens");
                pp_json_int(&j, o.batch_prompt);
                pp_json_key(&j, "step_s");
                pp_json_double(&j, r->batch_step_s);
                pp_json_key(&j, "tok_s");
                pp_json_double(&j, o.decode_batch / r->batch_step_s);
                pp_json_key(&j, "weight_bytes_per_step");
                pp_json_double(&j, r->batch_weight_bytes);
                pp_json_key(&j, "weights_bytes_s");
                pp_json_double(&j, r->batch_weight_bytes / r->batch_step_s);
                pp_json_key(&j, "weights_fraction_of_bandwidth_bound");
                pp_json_double(&j, r->batch_frac_bw);
                pp_json_end_object(&j);
            }
            pp_json_end_object(&j);
        }
        pp_json_end_array(&j);
        pp_json_key(&j, "f32_matmul_vs_openblas");
        pp_json_begin_array(&j);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 4; i++) {
                pp_json_begin_object(&j);
                pp_json_key(&j, "shape");
                pp_json_cstring(&j, shapes[i].name);
                pp_json_key(&j, "tokens");
                pp_json_int(&j, ns[k]);
                pp_json_key(&j, "ours_s");
                pp_json_double(&j, ours[k][i]);
                /* null where the build has no OpenBLAS */
                pp_json_key(&j, "openblas_s");
                if (have_blas)
                    pp_json_double(&j, blas[k][i]);
                else
                    pp_json_null(&j);
                pp_json_key(&j, "openblas_over_ours");
                if (have_blas && ours[k][i] > 0)
                    pp_json_double(&j, blas[k][i] / ours[k][i]);
                else
                    pp_json_null(&j);
                pp_json_end_object(&j);
            }
        pp_json_end_array(&j);
        pp_json_end_object(&j);
        int bad = pp_bench_write_json(o.json, "pp_bench", &j);
        pp_json_free(&j);
        if (bad)
            return 1;
    }
    return 0;
}
