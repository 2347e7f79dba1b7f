/* pp_bench_attn: the CPU backend's attention alone on the tinyllama shape (32 query heads, 4 KV
 * heads of 64, 22 layers), as a long prompt's prefill or a decode step runs it.
 *
 *   pp_bench_attn [--threads N] [--contexts LIST] [--decode B] [--reps R] [--json PATH]
 *
 * For each context P: one window of 256 prompt rows (the executor's default batch window) at
 * positions [P - 256, P), or with --decode B one row of each of B sequences at position P - 1,
 * attending over a paged f32 KV cache of 16-position blocks placed out of order (each sequence
 * its own), every layer in turn; the best of R passes. Prints ms per pass, GFLOP/s (4 · heads ·
 * head_dim FLOPs per query and position seen), that rate as a fraction of the machine's FP32 FMA
 * peak measured in the same run, and as a ratio to the first context's rate (how well the rate
 * holds as the context grows). Decode, which reads every position's K and V once per step, also
 * prints those bytes per second and their fraction of the read bandwidth measured before the
 * passes (at contexts whose cache fits the L3, part of it comes from there). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/json_write.h"

enum { WINDOW = 256, HEADS = 32, KV_HEADS = 4, HEAD_DIM = 64, LAYERS = 22, BLOCK = 16 };
enum { MAX_CONTEXTS = 16, MAX_CONTEXT = 1 << 16, MAX_DECODE = 64 };

struct result {
    int context;
    double best_s, gflops, kv_gbs;
};

static uint32_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

static float frand(uint64_t *s)
{
    return (float)(rng(s) & 0xffff) / 32768.0f - 1.0f;
}

static int parse_list(const char *s, int *out, int cap, int min)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == cap)
            return -1;
        out[n] = atoi(t);
        if (out[n] < min || out[n] > MAX_CONTEXT)
            return -1;
        n++;
    }
    return n;
}

/* The attention timed: rows of one prompt window, or one row of each of seqs sequences. */
struct mode {
    int rows, seqs;
};

/* Positions every row of the mode sees at context p, summed. */
static double positions_seen(const struct mode *md, int p)
{
    double n = 0.0;
    for (int t = 0; t < md->rows; t++)
        n += p - md->rows + t + 1;
    return n * md->seqs;
}

/* FLOPs of a pass at context p: each query's dot with and weighted sum of every position it sees,
 * 2 FLOPs per element each. */
static double pass_flops(const struct mode *md, int p)
{
    return LAYERS * 4.0 * HEADS * HEAD_DIM * positions_seen(md, p);
}

/* Bytes of K and V a pass reads at context p: each sequence's p positions in every layer. */
static double pass_kv_bytes(const struct mode *md, int p)
{
    return (double)LAYERS * md->seqs * p * 2.0 * KV_HEADS * HEAD_DIM * sizeof(float);
}

/* The best of reps passes over every layer at context p. Each sequence has its own blocks, all of
 * them out of order and the sequences' interleaved, as a cache that has served other sequences
 * hands them out. */
static double time_pass(struct pp_backend *be, const struct mode *md, int p, int reps, float *out,
                        const float *q)
{
    int per_seq = (p + BLOCK - 1) / BLOCK, n_blocks = per_seq * md->seqs;
    struct pp_kv_view kv = {0};
    kv.n_layers = LAYERS;
    kv.block_size = BLOCK;
    kv.kv_dim = KV_HEADS * HEAD_DIM;
    kv.block_elems = (int64_t)BLOCK * kv.kv_dim;
    size_t pool_n = (size_t)n_blocks * LAYERS * 2 * (size_t)kv.block_elems;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)n_blocks);
    struct pp_attn_seq *seqs = calloc((size_t)md->seqs, sizeof(*seqs));
    if (!table || !seqs ||
        be->ops->buf_alloc(be, PP_MEM_KV, (int64_t)(pool_n * sizeof(float)), (void **)&kv.pool) !=
            PP_OK) {
        free(table);
        free(seqs);
        return -1.0;
    }
    uint64_t seed = (uint64_t)p;
    for (size_t i = 0; i < pool_n; i++)
        kv.pool[i] = frand(&seed);
    for (int i = 0; i < n_blocks; i++)
        table[i] = (int32_t)((int64_t)i * 7 % n_blocks);
    if (n_blocks % 7 == 0)
        for (int i = 0; i < n_blocks; i++)
            table[i] = n_blocks - 1 - i;
    /* sequence s's k-th block is entry k · seqs + s: the sequences' blocks interleave */
    int32_t *own = malloc(sizeof(int32_t) * (size_t)n_blocks);
    if (!own) {
        be->ops->buf_free(be, PP_MEM_KV, kv.pool);
        free(table);
        free(seqs);
        return -1.0;
    }
    for (int s = 0; s < md->seqs; s++) {
        for (int k = 0; k < per_seq; k++)
            own[s * per_seq + k] = table[k * md->seqs + s];
        seqs[s] = (struct pp_attn_seq){s * md->rows, md->rows, p - md->rows, own + s * per_seq};
    }
    struct pp_attn_shape shape = {HEADS, KV_HEADS, HEAD_DIM, 0, 0.125f};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = pp_bench_now();
        for (int l = 0; l < LAYERS; l++)
            be->ops->attention(be, out, q, &kv, l, seqs, md->seqs, &shape);
        double t = pp_bench_now() - t0;
        if (t < best)
            best = t;
    }
    be->ops->buf_free(be, PP_MEM_KV, kv.pool);
    free(own);
    free(table);
    free(seqs);
    return best;
}

int main(int argc, char **argv)
{
    int threads = 1, reps = 3, decode = 0, contexts[MAX_CONTEXTS], n_ctx;
    const char *json = NULL, *list = NULL;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            goto usage;
        if (strcmp(a, "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(a, "--contexts") == 0)
            list = v;
        else if (strcmp(a, "--reps") == 0)
            reps = atoi(v);
        else if (strcmp(a, "--decode") == 0)
            decode = atoi(v);
        else if (strcmp(a, "--json") == 0)
            json = v;
        else
            goto usage;
    }
    if (decode < 0 || decode > MAX_DECODE)
        goto usage;
    struct mode md = {decode ? 1 : WINDOW, decode ? decode : 1};
    if (!list)
        list = decode ? "512,1024,2048,4096,8192" : "256,512,1024,2048,4096";
    n_ctx = parse_list(list, contexts, MAX_CONTEXTS, md.rows);
    if (threads < 1 || threads > 256 || reps < 1 || n_ctx < 1)
        goto usage;
    int max_ctx = 0;
    for (int i = 0; i < n_ctx; i++)
        max_ctx = contexts[i] > max_ctx ? contexts[i] : max_ctx;

    struct pp_backend *be;
    if (pp_backend_cpu_new(threads, &be) != PP_OK)
        return 1;
    if (be->ops->reserve(be, HEADS * HEAD_DIM, max_ctx) != PP_OK)
        return 1;
    size_t qn = (size_t)md.rows * md.seqs * HEADS * HEAD_DIM;
    float *q = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn);
    struct result *res = calloc((size_t)n_ctx, sizeof(*res));
    if (!q || !out || !res)
        return 1;
    uint64_t seed = 11;
    for (size_t i = 0; i < qn; i++)
        q[i] = frand(&seed);

    double peak = pp_bench_fma_peak(threads), load0 = pp_bench_loadavg();
    double bw = decode ? pp_bench_read_bandwidth(threads) : 0.0;
    if (decode)
        printf("pp_bench_attn: %d threads, tinyllama attention (%d/%d heads of %d, %d layers), "
               "decode: one row of each of %d sequences at each context, best of %d\n",
               threads, HEADS, KV_HEADS, HEAD_DIM, LAYERS, decode, reps);
    else
        printf("pp_bench_attn: %d threads, tinyllama attention (%d/%d heads of %d, %d layers), "
               "a %d-row prompt window at each context, best of %d\n",
               threads, HEADS, KV_HEADS, HEAD_DIM, LAYERS, WINDOW, reps);
    char cpu_name[160];
    pp_bench_cpu_name(cpu_name, sizeof(cpu_name));
    printf("cpu: %s\n", cpu_name);
    printf("machine: FP32 FMA peak %.1f GFLOP/s (%s", peak / 1e9, pp_bench_fma_isa());
    if (decode)
        printf("), read bandwidth %.2f GB/s (load average %.2f)\n", bw / 1e9, load0);
    else
        printf("; load average %.2f)\n", load0);
    printf("context    ms/pass   GFLOP/s  of peak  vs first%s\n",
           decode ? "   KV GB/s  of bandwidth" : "");
    for (int i = 0; i < n_ctx; i++) {
        res[i].context = contexts[i];
        res[i].best_s = time_pass(be, &md, contexts[i], reps, out, q);
        if (res[i].best_s <= 0) {
            fprintf(stderr, "pp_bench_attn: no memory for a %.2f GiB KV cache (context %d)\n",
                    pass_kv_bytes(&md, contexts[i]) / (1 << 30), contexts[i]);
            return 1;
        }
        res[i].gflops = pass_flops(&md, contexts[i]) / res[i].best_s / 1e9;
        res[i].kv_gbs = pass_kv_bytes(&md, contexts[i]) / res[i].best_s / 1e9;
        printf("%7d %10.2f %9.1f %7.1f%% %9.3f", contexts[i], res[i].best_s * 1e3, res[i].gflops,
               peak > 0 ? 100 * res[i].gflops * 1e9 / peak : 0.0, res[i].gflops / res[0].gflops);
        if (decode)
            printf(" %10.2f %11.1f%%", res[i].kv_gbs, 100 * res[i].kv_gbs * 1e9 / bw);
        printf("\n");
    }
    double load1 = pp_bench_loadavg();
    if (decode) {
        double bw1 = pp_bench_read_bandwidth(threads);
        printf("read bandwidth again %.2f GB/s; the fractions above are of the first\n",
               bw1 / 1e9);
    }
    printf("load average at the end %.2f\n", load1);

    int rc = 0;
    if (json) {
        struct pp_json j;
        pp_json_init(&j);
        pp_json_begin_object(&j);
        pp_json_key(&j, "cpu");
        pp_json_cstring(&j, cpu_name);
        pp_json_key(&j, "threads");
        pp_json_int(&j, threads);
        pp_json_key(&j, "mode");
        pp_json_cstring(&j, decode ? "decode" : "prompt_window");
        pp_json_key(&j, "rows_per_sequence");
        pp_json_int(&j, md.rows);
        pp_json_key(&j, "sequences");
        pp_json_int(&j, md.seqs);
        pp_json_key(&j, "fma_peak_flops");
        pp_json_double(&j, peak);
        if (decode) {
            pp_json_key(&j, "read_bandwidth_bytes_per_s");
            pp_json_double(&j, bw);
        }
        pp_bench_json_pair(&j, "load_average", load0, load1);
        pp_json_key(&j, "results");
        pp_json_begin_array(&j);
        for (int i = 0; i < n_ctx; i++) {
            pp_json_begin_object(&j);
            pp_json_key(&j, "context");
            pp_json_int(&j, res[i].context);
            pp_json_key(&j, "best_s");
            pp_json_double(&j, res[i].best_s);
            pp_json_key(&j, "gflops");
            pp_json_double(&j, res[i].gflops);
            pp_json_key(&j, "fraction_of_fma_peak");
            pp_json_double(&j, peak > 0 ? res[i].gflops * 1e9 / peak : 0.0);
            pp_json_key(&j, "ratio_to_first_context");
            pp_json_double(&j, res[i].gflops / res[0].gflops);
            if (decode) {
                pp_json_key(&j, "kv_bytes_per_s");
                pp_json_double(&j, res[i].kv_gbs * 1e9);
                pp_json_key(&j, "fraction_of_read_bandwidth");
                pp_json_double(&j, res[i].kv_gbs * 1e9 / bw);
            }
            pp_json_end_object(&j);
        }
        pp_json_end_array(&j);
        pp_json_end_object(&j);
        rc = pp_bench_write_json(json, "pp_bench_attn", &j) ? 1 : 0;
        pp_json_free(&j);
    }
    free(q);
    free(out);
    free(res);
    be->ops->free(be);
    return rc;

usage:
    fprintf(stderr,
            "usage: pp_bench_attn [--threads N] [--contexts LIST] [--decode B] [--reps R] "
            "[--json PATH]\n  contexts: at most %d, each %d to %d positions (1 to %d with "
            "--decode)\n  --decode B: one row of each of B sequences (1 to %d) instead of a "
            "%d-row prompt window\n",
            MAX_CONTEXTS, WINDOW, MAX_CONTEXT, MAX_CONTEXT, MAX_DECODE, WINDOW);
    return 2;
}
