/* pp_bench_tp: tensor and expert parallelism on this machine's cores.
 *
 *   pp_bench_tp [--model PATH] [--moe-model PATH] [--prompt N] [--decode N] [--rounds N]
 *               [--json PATH]
 *
 * Dense model (default: the tinyllama-shaped f16 GGUF that pp_bench uses) in three layouts,
 * interleaved round by round so a busy neighbour slows all of them alike: TP 1 on one thread, TP 1
 * on two threads (the kernels' own threading), TP 2 on two threads (two workers of one thread
 * each).
 * For each: prefill tokens/s of one prompt (best pass), greedy decode tokens/s (median step), and
 * bytes all-reduced per token. Prints TP 2 against TP 1 on one core (the goal: prefill >= 1.6x).
 *
 * MoE model (default: a Mixtral-shaped f16 model, 8 experts, top 2, written when missing): TP 1 on
 * one thread, TP 2 and EP 2 on two threads; then the expert load of the EP 2 run: tokens per
 * expert and per worker in every layer, the max/mean ratios, and the bytes an all-to-all dispatch
 * + combine would move against the all-reduce the executor does. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/bench.h"
#include "common/json_write.h"
#include "model/executor.h"
#include "model/model.h"
#include "model/synth.h"

#define MAX_LAYOUTS 3

struct layout {
    const char *name;
    int threads;
    int tp;
    int ep;
    double prefill_tok_s; /* best over rounds */
    double decode_tok_s;  /* best round's median step */
    double reduced_bytes_per_token;
};

/* Expert load of one run (the last round of the last MoE layout). */
struct moe_load {
    int32_t n_layers, n_experts, k, n_workers;
    int64_t tokens;
    int64_t *per_expert;  /* [n_layers, n_experts] */
    int64_t *per_worker;  /* [n_layers, n_workers] */
    int32_t *first;       /* [n_workers] first expert of each worker */
    int32_t *count;       /* [n_workers] experts of each worker */
    double reduce_bytes;  /* measured: all-reduced per worker over the run */
};

struct opts {
    const char *model;
    const char *moe_model;
    int prompt;
    int decode;
    int rounds;
    const char *json;
};

/* path = dir/model.gguf, written from spec when missing. */
static pp_status ensure_model(const char *dir, const struct pp_synth_spec *spec, char *path,
                              size_t cap)
{
    snprintf(path, cap, "%s/model.gguf", dir);
    struct stat st;
    if (stat(path, &st) == 0)
        return PP_OK;
    mkdir("/tmp/pp_bench_models", 0755);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pp_error(PP_ERR_IO, "cannot create %s", dir);
    fprintf(stderr, "writing %s ...\n", path);
    return pp_synth_write_gguf(spec, path);
}

static pp_status default_dense(char *path, size_t cap)
{
    struct pp_synth_spec spec;
    pp_status s = pp_synth_shape("tinyllama", &spec);
    spec.dtype = PP_DTYPE_F16;
    return s != PP_OK ? s : ensure_model("/tmp/pp_bench_models/f16", &spec, path, cap);
}

static pp_status default_moe(char *path, size_t cap)
{
    struct pp_synth_spec spec;
    pp_synth_spec_defaults(&spec);
    snprintf(spec.arch, sizeof(spec.arch), "mixtral");
    spec.dim = 1024;
    spec.n_layers = 8;
    spec.n_heads = 16;
    spec.n_kv_heads = 4;
    spec.ffn_dim = 1408;
    spec.vocab_size = 8000;
    spec.max_context = 1024;
    spec.n_experts = 8;
    spec.n_experts_used = 2;
    spec.dtype = PP_DTYPE_F16;
    return ensure_model("/tmp/pp_bench_models/moe-f16", &spec, path, cap);
}

static void load_free(struct moe_load *ld)
{
    free(ld->per_expert);
    free(ld->per_worker);
    free(ld->first);
    free(ld->count);
    memset(ld, 0, sizeof(*ld));
}

/* The executor's expert counts and worker ranges, after a run of `tokens` tokens. */
static void take_load(struct pp_executor *ex, const struct pp_model *m, int64_t tokens,
                      struct moe_load *ld)
{
    load_free(ld);
    const struct pp_model_config *c = &m->cfg;
    ld->n_layers = m->last_layer - m->first_layer;
    ld->n_experts = c->n_experts;
    ld->k = c->n_experts_used;
    ld->n_workers = pp_executor_workers(ex);
    ld->tokens = tokens;
    ld->per_expert = calloc((size_t)ld->n_layers * ld->n_experts, sizeof(int64_t));
    ld->per_worker = calloc((size_t)ld->n_layers * ld->n_workers, sizeof(int64_t));
    ld->first = calloc((size_t)ld->n_workers, sizeof(int32_t));
    ld->count = calloc((size_t)ld->n_workers, sizeof(int32_t));
    if (!ld->per_expert || !ld->per_worker || !ld->first || !ld->count) {
        load_free(ld);
        return;
    }
    for (int32_t w = 0; w < ld->n_workers; w++)
        pp_executor_worker_experts(ex, w, &ld->first[w], &ld->count[w]);
    for (int32_t l = 0; l < ld->n_layers; l++) {
        const int64_t *e = pp_executor_expert_tokens(ex, l);
        if (!e)
            continue;
        memcpy(ld->per_expert + (int64_t)l * ld->n_experts, e, sizeof(int64_t) * ld->n_experts);
        for (int32_t w = 0; w < ld->n_workers; w++)
            for (int32_t x = ld->first[w]; x < ld->first[w] + ld->count[w]; x++)
                ld->per_worker[(int64_t)l * ld->n_workers + w] += e[x];
    }
    ld->reduce_bytes = (double)pp_executor_bytes_reduced(ex);
}

static double max_over_mean(const int64_t *v, int32_t n)
{
    int64_t max = 0, sum = 0;
    for (int32_t i = 0; i < n; i++) {
        sum += v[i];
        max = v[i] > max ? v[i] : max;
    }
    return sum > 0 ? (double)max * n / (double)sum : 0.0;
}

/* One round of one layout: a warm-up and a timed prefill, then o->decode greedy steps. */
static pp_status run_round(const struct opts *o, const struct pp_model *m, struct layout *l,
                           struct moe_load *ld)
{
    struct pp_backend *bes[8] = {0};
    struct pp_executor *ex = NULL;
    const struct pp_model_config *c = &m->cfg;
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    int32_t *ids = malloc((size_t)o->prompt * sizeof(int32_t));
    double *steps = malloc((size_t)o->decode * sizeof(double));
    pp_status st = PP_ERR_NOMEM;
    if (!logits || !ids || !steps)
        goto out;
    if ((st = pp_backend_cpu_new_workers(l->threads, l->tp, bes)) != PP_OK)
        goto out;
    struct pp_executor_opts eo = {0};
    eo.max_seqs = 2;
    eo.max_context = o->prompt + o->decode + 8;
    eo.ep = l->ep;
    if ((st = pp_executor_new_workers(m, bes, l->tp, &eo, &ex)) != PP_OK)
        goto out;
    for (int i = 0; i < o->prompt; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    for (int pass = 0; pass < 2; pass++) {
        struct pp_exec_seq seq = {1, 0, o->prompt, 1};
        struct pp_exec_batch b = {1, &seq, ids, NULL};
        pp_executor_release(ex, 1);
        double t0 = pp_bench_now();
        if ((st = pp_executor_forward(ex, &b, NULL, logits)) != PP_OK)
            goto out;
        double t = pp_bench_now() - t0;
        if (pass > 0 && o->prompt / t > l->prefill_tok_s)
            l->prefill_tok_s = o->prompt / t;
    }
    int64_t reduced0 = pp_executor_bytes_reduced(ex);
    int32_t tok = pp_bench_argmax(logits, c->vocab_size);
    for (int i = 0; i < o->decode; i++) {
        struct pp_exec_seq seq = {1, o->prompt + i, 1, 1};
        struct pp_exec_batch b = {1, &seq, &tok, NULL};
        double t0 = pp_bench_now();
        if ((st = pp_executor_forward(ex, &b, NULL, logits)) != PP_OK)
            goto out;
        steps[i] = pp_bench_now() - t0;
        tok = pp_bench_argmax(logits, c->vocab_size);
    }
    l->reduced_bytes_per_token = (double)(pp_executor_bytes_reduced(ex) - reduced0) / o->decode;
    qsort(steps, (size_t)o->decode, sizeof(double), pp_bench_cmp_double);
    if (1.0 / steps[o->decode / 2] > l->decode_tok_s)
        l->decode_tok_s = 1.0 / steps[o->decode / 2];
    if (ld && c->n_experts > 0)
        take_load(ex, m, 2 * (int64_t)o->prompt + o->decode, ld);
out:
    pp_executor_free(ex);
    pp_backend_free_all(bes, 8);
    free(logits);
    free(ids);
    free(steps);
    return st;
}

static pp_status run_model(const struct opts *o, const char *path, struct layout *ls, int n,
                           struct moe_load *ld)
{
    struct pp_model *m = NULL;
    pp_status st = pp_model_open(path, 0, -1, &m);
    for (int r = 0; r < o->rounds && st == PP_OK; r++)
        for (int i = 0; i < n && st == PP_OK; i++)
            st = run_round(o, m, &ls[i], ld);
    pp_model_free(m);
    return st;
}

static void print_layouts(const char *title, const struct layout *ls, int n)
{
    printf("%s\n%-14s %7s %3s %3s %12s %11s %18s\n", title, "layout", "threads", "tp", "ep",
           "prefill t/s", "decode t/s", "all-reduced B/tok");
    for (int i = 0; i < n; i++)
        printf("%-14s %7d %3d %3d %12.1f %11.2f %18.0f\n", ls[i].name, ls[i].threads, ls[i].tp,
               ls[i].ep, ls[i].prefill_tok_s, ls[i].decode_tok_s, ls[i].reduced_bytes_per_token);
}

/* Bytes one worker sends over the run to combine the MoE outputs, counted as a network would:
 *  - ring all-reduce (what the executor does): 2 (W - 1) / W of the buffer it reduces (measured);
 *  - all-to-all dispatch + combine: a token homed on one of the W workers (tokens spread evenly)
 *    sends its hidden state to each of its k experts' workers unless the expert is its own
 *    ((W - 1) / W of the routed pairs, counted from the routing) and gets the output back;
 *  - the same plus the all-gather that restores the replicated residual stream every worker keeps
 *    ((W - 1) / W of the layer's [T, dim]). */
struct combine_bytes {
    double all_reduce, all_to_all, all_to_all_gather;
};

static struct combine_bytes combine_bytes(const struct moe_load *ld, int32_t dim)
{
    double w = ld->n_workers, pairs = 0;
    for (int64_t i = 0; i < (int64_t)ld->n_layers * ld->n_experts; i++)
        pairs += (double)ld->per_expert[i];
    double row = dim * 4.0, moe_buffer = ld->reduce_bytes / 2.0; /* the other half: attention */
    struct combine_bytes b;
    b.all_reduce = 2.0 * (w - 1) / w * moe_buffer;
    b.all_to_all = 2.0 * pairs / w * (w - 1) / w * row;
    b.all_to_all_gather = b.all_to_all + (w - 1) / w * moe_buffer;
    return b;
}

static void print_load(const struct moe_load *ld, int32_t dim)
{
    printf("expert load of the ep run (%lld tokens, top %d of %d experts, %d workers):\n",
           (long long)ld->tokens, ld->k, ld->n_experts, ld->n_workers);
    printf("layer  tokens per expert%*s tokens per worker  max/mean expert  max/mean worker\n",
           ld->n_experts * 6 - 17, "");
    for (int32_t l = 0; l < ld->n_layers; l++) {
        printf("%5d  ", l);
        for (int32_t e = 0; e < ld->n_experts; e++)
            printf("%5lld ", (long long)ld->per_expert[(int64_t)l * ld->n_experts + e]);
        printf("  ");
        for (int32_t w = 0; w < ld->n_workers; w++)
            printf("%6lld ", (long long)ld->per_worker[(int64_t)l * ld->n_workers + w]);
        printf("%*s%8.3f %16.3f\n", 18 - 7 * ld->n_workers > 0 ? 18 - 7 * ld->n_workers : 0, "",
               max_over_mean(ld->per_expert + (int64_t)l * ld->n_experts, ld->n_experts),
               max_over_mean(ld->per_worker + (int64_t)l * ld->n_workers, ld->n_workers));
    }
    struct combine_bytes b = combine_bytes(ld, dim);
    printf("MoE combine, bytes sent per worker over the run: ring all-reduce %.0f; all-to-all "
           "dispatch + combine %.0f (%.2fx); with the all-gather of the residual %.0f (%.2fx)\n",
           b.all_reduce, b.all_to_all, b.all_to_all / b.all_reduce, b.all_to_all_gather,
           b.all_to_all_gather / b.all_reduce);
}

static void json_layouts(struct pp_json *j, const char *key, const struct layout *ls, int n)
{
    pp_json_key(j, key);
    pp_json_begin_array(j);
    for (int i = 0; i < n; i++) {
        pp_json_begin_object(j);
        pp_json_key(j, "name");
        pp_json_cstring(j, ls[i].name);
        pp_json_key(j, "threads");
        pp_json_int(j, ls[i].threads);
        pp_json_key(j, "tp");
        pp_json_int(j, ls[i].tp);
        pp_json_key(j, "ep");
        pp_json_int(j, ls[i].ep);
        pp_json_key(j, "prefill_tok_s");
        pp_json_double(j, ls[i].prefill_tok_s);
        pp_json_key(j, "decode_tok_s");
        pp_json_double(j, ls[i].decode_tok_s);
        pp_json_key(j, "all_reduced_bytes_per_token");
        pp_json_double(j, ls[i].reduced_bytes_per_token);
        pp_json_end_object(j);
    }
    pp_json_end_array(j);
}

static void json_load(struct pp_json *j, const struct moe_load *ld, int32_t dim)
{
    pp_json_key(j, "expert_load");
    pp_json_begin_object(j);
    pp_json_key(j, "tokens");
    pp_json_int(j, ld->tokens);
    pp_json_key(j, "per_layer");
    pp_json_begin_array(j);
    for (int32_t l = 0; l < ld->n_layers; l++) {
        pp_json_begin_object(j);
        pp_json_key(j, "tokens_per_expert");
        pp_json_begin_array(j);
        for (int32_t e = 0; e < ld->n_experts; e++)
            pp_json_int(j, ld->per_expert[(int64_t)l * ld->n_experts + e]);
        pp_json_end_array(j);
        pp_json_key(j, "tokens_per_worker");
        pp_json_begin_array(j);
        for (int32_t w = 0; w < ld->n_workers; w++)
            pp_json_int(j, ld->per_worker[(int64_t)l * ld->n_workers + w]);
        pp_json_end_array(j);
        pp_json_key(j, "max_over_mean_expert");
        pp_json_double(j, max_over_mean(ld->per_expert + (int64_t)l * ld->n_experts,
                                        ld->n_experts));
        pp_json_key(j, "max_over_mean_worker");
        pp_json_double(j, max_over_mean(ld->per_worker + (int64_t)l * ld->n_workers,
                                        ld->n_workers));
        pp_json_end_object(j);
    }
    pp_json_end_array(j);
    struct combine_bytes b = combine_bytes(ld, dim);
    pp_json_key(j, "combine_sent_bytes_per_worker");
    pp_json_begin_object(j);
    pp_json_key(j, "ring_all_reduce");
    pp_json_double(j, b.all_reduce);
    pp_json_key(j, "all_to_all");
    pp_json_double(j, b.all_to_all);
    pp_json_key(j, "all_to_all_plus_all_gather");
    pp_json_double(j, b.all_to_all_gather);
    pp_json_end_object(j);
    pp_json_end_object(j);
}

static void write_json(const struct opts *o, const char *dense, const struct layout *ls,
                       const char *moe, const struct layout *ms, const struct moe_load *ld,
                       int32_t moe_dim, double load0, double load1)
{
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_key(&j, "model");
    pp_json_cstring(&j, dense);
    pp_json_key(&j, "moe_model");
    pp_json_cstring(&j, moe);
    pp_json_key(&j, "prompt");
    pp_json_int(&j, o->prompt);
    pp_json_key(&j, "decode");
    pp_json_int(&j, o->decode);
    pp_json_key(&j, "rounds");
    pp_json_int(&j, o->rounds);
    pp_json_key(&j, "loadavg_before");
    pp_json_double(&j, load0);
    pp_json_key(&j, "loadavg_after");
    pp_json_double(&j, load1);
    json_layouts(&j, "dense", ls, MAX_LAYOUTS);
    pp_json_key(&j, "prefill_tp2_over_tp1_1thread");
    pp_json_double(&j, ls[2].prefill_tok_s / ls[0].prefill_tok_s);
    pp_json_key(&j, "decode_tp2_over_tp1_1thread");
    pp_json_double(&j, ls[2].decode_tok_s / ls[0].decode_tok_s);
    pp_json_key(&j, "prefill_tp2_over_tp1_2threads");
    pp_json_double(&j, ls[2].prefill_tok_s / ls[1].prefill_tok_s);
    pp_json_key(&j, "decode_tp2_over_tp1_2threads");
    pp_json_double(&j, ls[2].decode_tok_s / ls[1].decode_tok_s);
    json_layouts(&j, "moe", ms, MAX_LAYOUTS);
    if (ld->per_expert)
        json_load(&j, ld, moe_dim);
    pp_json_end_object(&j);
    pp_bench_write_json(o->json, "pp_bench_tp", &j);
    pp_json_free(&j);
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){NULL, NULL, 128, 32, 2, NULL};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return -1;
        if (strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--moe-model") == 0)
            o->moe_model = v;
        else if (strcmp(a, "--prompt") == 0)
            o->prompt = atoi(v);
        else if (strcmp(a, "--decode") == 0)
            o->decode = atoi(v);
        else if (strcmp(a, "--rounds") == 0)
            o->rounds = atoi(v);
        else if (strcmp(a, "--json") == 0)
            o->json = v;
        else
            return -1;
    }
    return o->prompt >= 1 && o->decode >= 1 && o->rounds >= 1 ? 0 : -1;
}

static int fail(pp_status st)
{
    fprintf(stderr, "pp_bench_tp: %s: %s\n", pp_strerror(st), pp_error_detail());
    return 1;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: pp_bench_tp [--model PATH] [--moe-model PATH] [--prompt N] "
                        "[--decode N] [--rounds N] [--json PATH]\n");
        return 2;
    }
    char dense[4096], moe[4096];
    pp_status st = PP_OK;
    if (o.model)
        snprintf(dense, sizeof(dense), "%s", o.model);
    else if ((st = default_dense(dense, sizeof(dense))) != PP_OK)
        return fail(st);
    if (o.moe_model)
        snprintf(moe, sizeof(moe), "%s", o.moe_model);
    else if ((st = default_moe(moe, sizeof(moe))) != PP_OK)
        return fail(st);
    struct pp_model_config moe_cfg;
    if ((st = pp_model_read_config(moe, &moe_cfg)) != PP_OK)
        return fail(st);
    struct layout ls[MAX_LAYOUTS] = {
        {"tp1_1thread", 1, 1, 1, 0, 0, 0},
        {"tp1_2threads", 2, 1, 1, 0, 0, 0},
        {"tp2_2threads", 2, 2, 1, 0, 0, 0},
    };
    struct layout ms[MAX_LAYOUTS] = {
        {"tp1_1thread", 1, 1, 1, 0, 0, 0},
        {"tp2_2threads", 2, 2, 1, 0, 0, 0},
        {"ep2_2threads", 2, 2, 2, 0, 0, 0},
    };
    struct moe_load ld = {0};
    double load0 = pp_bench_loadavg();
    printf("pp_bench_tp: prompt %d, decode %d, %d rounds, load %.2f\n", o.prompt, o.decode,
           o.rounds, load0);
    if ((st = run_model(&o, dense, ls, MAX_LAYOUTS, NULL)) != PP_OK ||
        (st = run_model(&o, moe, ms, MAX_LAYOUTS, &ld)) != PP_OK) {
        load_free(&ld);
        return fail(st);
    }
    double load1 = pp_bench_loadavg();
    print_layouts(dense, ls, MAX_LAYOUTS);
    printf("TP 2 (2 cores) / TP 1 (1 core): prefill %.3fx (goal >= 1.6), decode %.3fx\n",
           ls[2].prefill_tok_s / ls[0].prefill_tok_s, ls[2].decode_tok_s / ls[0].decode_tok_s);
    printf("TP 2 / TP 1 on 2 threads:        prefill %.3fx, decode %.3fx\n\n",
           ls[2].prefill_tok_s / ls[1].prefill_tok_s, ls[2].decode_tok_s / ls[1].decode_tok_s);
    print_layouts(moe, ms, MAX_LAYOUTS);
    printf("EP 2 / TP 1 (1 core): prefill %.3fx, decode %.3fx; EP 2 / TP 2: prefill %.3fx, "
           "decode %.3fx\n", ms[2].prefill_tok_s / ms[0].prefill_tok_s,
           ms[2].decode_tok_s / ms[0].decode_tok_s, ms[2].prefill_tok_s / ms[1].prefill_tok_s,
           ms[2].decode_tok_s / ms[1].decode_tok_s);
    if (ld.per_expert)
        print_load(&ld, moe_cfg.dim);
    printf("load average %.2f before, %.2f after\n", load0, load1);
    if (o.json)
        write_json(&o, dense, ls, moe, ms, &ld, moe_cfg.dim, load0, load1);
    load_free(&ld);
    return 0;
}
