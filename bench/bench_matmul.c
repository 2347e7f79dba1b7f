/* pp_bench_matmul: the CPU matmul alone on few tokens (decode and small microbatches), as GB/s of
 * weights streamed.
 *
 *   pp_bench_matmul [--threads N] [--dtypes f16,bf16,q8_0,f32] [--tokens 1,2,4,8,12] [--reps R]
 *                   [--row-div D] [--layers L] [--layout groups|rows|both] [--beside P]
 *                   [--json PATH]
 *
 * The weights are the seven matrices of a tinyllama layer (wq, wk, wv, wo, gate, up, down; 88 MB
 * in f16), random, in the given dtype, in huge-page memory as the engine holds them, L distinct
 * copies (default 8: 705 MB in f16, so that no pass finds the last one's weights in a 32 MiB L3 —
 * one 88 MB layer read again and again did, and streamed 10-20% faster than a model can). One
 * pass runs the L × 7 matmuls in a decode step's order with n tokens; a figure is the median of R
 * passes (best beside it) after a warm-up pass. GB/s = weight bytes of the pass ÷ its time: each
 * weight byte is read once per call, so this is the rate the kernel streams weights at. pp_bench's
 * read bandwidth is measured before and after the passes, and each figure is also printed as a
 * fraction of the better of the two. "cpu GB/s" divides by the median CPU time of the process per
 * thread instead, which a preempting neighbour does not inflate (exact with one thread; with more
 * it counts the workers' spinning between calls). --row-div D keeps 1/D of each matrix's rows and
 * (unless --layers says otherwise) one layer: with D = 64 (1.4 MB in f16) the weights come from
 * the caches, which shows what the loops cost without the memory. --layout: the weights as the
 * backend's weight_load stores them (groups, the default: rows in groups of 3, interleaved), or
 * row-major as in the model file (rows: how the backend computes with cpu_weights = "map"), or
 * both, held side by side and timed in alternating passes (the order swapped every pass), with
 * groups / rows printed: the host's bandwidth drifts by tens of percent between runs, so only
 * passes in one run compare the layouts. --beside P then runs P more passes of the first layout,
 * each between two single read passes over a 256 MiB buffer (one stream per thread, then four,
 * as pp_bench's decode beside the bandwidth): a pass's bound is the better read pass beside it,
 * and the figures are the median of the passes' fractions of their bounds, over all passes and
 * over those whose bound is at least 1.25 times the 10th percentile of the bounds (the host's
 * bandwidth flips between two levels, about 33 and 55-63 GB/s on two threads, some seconds or
 * minutes apart; this tells whether the kernel keeps up in the fast moments too, and a run spent
 * wholly in one level shows it in its overall figure beside its median bound).
 * Not run by ctest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "common/alloc.h"
#include "common/json_write.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

#define N_MATS 7
#define BESIDE_BW_BYTES ((size_t)256 << 20)
#define MAX_BESIDE 4096
#define MAX_TOKENS 512
#define MAX_LAYERS 32

static const struct pp_bench_shape mats[N_MATS] = {
    {"wq", 2048, 2048},   {"wk", 256, 2048},   {"wv", 256, 2048},  {"wo", 2048, 2048},
    {"gate", 5632, 2048}, {"up", 5632, 2048}, {"down", 2048, 5632}};

/* CPU seconds of the whole process (all threads; the pool's workers spin briefly between ops). */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* A random [rows, cols] weight stored as dt, in huge-page memory (pp_free_huge frees it). */
static void *weight_new(enum pp_dtype dt, int64_t rows, int64_t cols, uint64_t *seed)
{
    int64_t rb = pp_dtype_row_bytes(dt, cols);
    char *w = pp_alloc_huge(PP_MEM_WEIGHTS, (size_t)(rows * rb));
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!w || !row) {
        pp_free_huge(PP_MEM_WEIGHTS, w, (size_t)(rows * rb));
        free(row);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++)
            row[i] = (float)(rng(seed) & 0xffff) / 32768.0f - 1.0f;
        char *dst = w + r * rb;
        if (dt == PP_DTYPE_Q8_0) {
            pp_quantize_q8_0(dst, row, cols);
            continue;
        }
        for (int64_t i = 0; i < cols; i++) {
            if (dt == PP_DTYPE_F32)
                memcpy(dst + i * 4, &row[i], 4);
            else {
                uint16_t h = dt == PP_DTYPE_F16 ? pp_f32_to_f16(row[i]) : pp_f32_to_bf16(row[i]);
                memcpy(dst + i * 2, &h, 2);
            }
        }
    }
    free(row);
    return w;
}

enum { ROWS, GROUPS };
static const char *const layout_names[2] = {"rows", "groups"};

/* What --beside found for one dtype and token count. */
struct beside {
    double frac;      /* median over the passes of a pass's rate ÷ its bound */
    double fast_frac; /* the same over the passes in fast moments */
    int fast;         /* how many passes were in fast moments */
};

struct result {
    char dtype[8];
    int tokens;
    int layout;
    double median_s, best_s, cpu_s, bytes;
    struct beside beside; /* --beside */
};

/* The median of v[0, n) (sorted in place), 0 when n is 0. */
static double median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof(double), pp_bench_cmp_double);
    return v[n / 2];
}

/* Passes beside the bandwidth whose bound is at least this times the 10th percentile of the
 * bounds: fast moments. */
#define BESIDE_FAST 1.25

/* p passes of the weights w[0, n_w) with n tokens, each between two read passes of probe:
 * prints and returns the median of the passes' fractions of their bounds, over all of them and
 * over those in fast moments. */
static struct beside run_beside(struct pp_backend *be, struct pp_bench_bw *probe, int threads,
                                const struct pp_weight *w, int n_w, double bytes, float *y,
                                const float *x, int n, int p, const char *dtype)
{
    static double bound[MAX_BESIDE], frac[MAX_BESIDE], v[MAX_BESIDE];
    double before = pp_bench_bw_pass(probe, threads, 1);
    for (int i = 0; i < p; i++) {
        double t0 = pp_bench_now();
        for (int k = 0; k < n_w; k++)
            be->ops->matmul(be, y, x, &w[k], n);
        double rate = bytes / (pp_bench_now() - t0);
        double after = pp_bench_bw_pass(probe, threads, (i + 1) % 2 ? 4 : 1);
        bound[i] = before > after ? before : after;
        frac[i] = rate / bound[i];
        before = after;
    }
    memcpy(v, bound, sizeof(double) * (size_t)p);
    double mid = median(v, p), low = v[p / 10], fast_bw = 0.0; /* v sorted by median() */
    struct beside r = {0.0, 0.0, 0};
    for (int i = 0; i < p; i++)
        if (bound[i] >= BESIDE_FAST * low) {
            v[r.fast++] = frac[i];
            fast_bw += bound[i];
        }
    r.fast_frac = median(v, r.fast);
    memcpy(v, frac, sizeof(double) * (size_t)p);
    r.frac = median(v, p);
    printf("%-6s %6d beside the bandwidth, %d passes: %5.1f%% of their bounds (median bound %.1f "
           "GB/s); in fast moments (%d passes, mean bound %.1f GB/s) %5.1f%%\n",
           dtype, n, p, 100 * r.frac, mid / 1e9, r.fast, r.fast ? fast_bw / r.fast / 1e9 : 0.0,
           100 * r.fast_frac);
    return r;
}

static int parse_list(const char *s, int *out, int cap)
{
    int n = 0;
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < cap;
         t = strtok_r(NULL, ",", &save)) {
        out[n] = atoi(t);
        if (out[n] < 1 || out[n] > MAX_TOKENS)
            return -1;
        n++;
    }
    return n;
}

int main(int argc, char **argv)
{
    int threads = 1, reps = 9, tokens[16], n_tokens, row_div = 1, layers = 0, beside = 0;
    char dtypes[64] = "f16,bf16,q8_0";
    const char *json = NULL, *tok_list = "1,2,4,8,12", *layout = "groups";
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            goto usage;
        if (strcmp(a, "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(a, "--dtypes") == 0)
            snprintf(dtypes, sizeof(dtypes), "%s", v);
        else if (strcmp(a, "--tokens") == 0)
            tok_list = v;
        else if (strcmp(a, "--reps") == 0)
            reps = atoi(v);
        else if (strcmp(a, "--json") == 0)
            json = v;
        else if (strcmp(a, "--row-div") == 0)
            row_div = atoi(v);
        else if (strcmp(a, "--layers") == 0)
            layers = atoi(v);
        else if (strcmp(a, "--layout") == 0)
            layout = v;
        else if (strcmp(a, "--beside") == 0)
            beside = atoi(v);
        else
            goto usage;
    }
    n_tokens = parse_list(tok_list, tokens, 16);
    if (layers == 0)
        layers = row_div > 1 ? 1 : 8;
    /* the layouts timed: have[ROWS], have[GROUPS] */
    int have[2] = {strcmp(layout, "groups") != 0, strcmp(layout, "rows") != 0};
    if (threads < 1 || reps < 1 || n_tokens < 1 || row_div < 1 || row_div > 256 || layers < 1 ||
        layers > MAX_LAYERS || beside < 0 || beside > MAX_BESIDE || (beside > 0 && beside < 3) ||
        (strcmp(layout, "groups") != 0 && strcmp(layout, "rows") != 0 &&
         strcmp(layout, "both") != 0))
        goto usage;
    int n_lay = have[ROWS] + have[GROUPS], lays[2] = {have[ROWS] ? ROWS : GROUPS, GROUPS};

    struct pp_backend *be;
    if (pp_backend_cpu_new(threads, &be) != PP_OK || be->ops->reserve(be, 8192, 16) != PP_OK)
        return 1;
    float *x = malloc(sizeof(float) * MAX_TOKENS * 5632);
    float *y = malloc(sizeof(float) * MAX_TOKENS * 5632);
    double *times = malloc(sizeof(double) * 2 * (size_t)reps);
    double *cpus = malloc(sizeof(double) * 2 * (size_t)reps);
    struct pp_bench_bw *probe = beside ? pp_bench_bw_new(BESIDE_BW_BYTES) : NULL;
    if (!x || !y || !times || !cpus || (beside && !probe))
        return 1;
    uint64_t seed = 5;
    for (int i = 0; i < MAX_TOKENS * 5632; i++)
        x[i] = (float)(rng(&seed) & 0xffff) / 32768.0f - 1.0f;

    double load0 = pp_bench_loadavg();
    double bw0 = pp_bench_read_bandwidth(threads);
    printf(
        "pp_bench_matmul: %d threads, %d tinyllama layers' matrices (1/%d of the rows; layout %s), "
        "median of %d passes (load average %.2f, read bandwidth %.2f GB/s)\n",
        threads, layers, row_div, layout, reps, load0, bw0 / 1e9);
    char cpu_name[160];
    pp_bench_cpu_name(cpu_name, sizeof(cpu_name));
    printf("cpu: %s\n", cpu_name);
    printf("%-6s %6s %-6s %10s %10s %9s %9s %9s %9s\n", "dtype", "tokens", "layout", "MB/pass",
           "median ms", "GB/s", "best GB/s", "cpu GB/s", "GFLOP/s");
    struct result res[64];
    int n_res = 0;
    char list[64];
    snprintf(list, sizeof(list), "%s", dtypes);
    for (char *save = NULL, *d = strtok_r(list, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
        int dt = pp_dtype_parse(d);
        if (dt < 0) {
            fprintf(stderr, "unknown dtype %s\n", d);
            return 2;
        }
        static struct pp_weight w[2][MAX_LAYERS * N_MATS]; /* [ROWS], [GROUPS] */
        int n_w = layers * N_MATS;
        double bytes = 0.0, flops_per_tok = 0.0;
        for (int i = 0; i < n_w; i++) {
            int m = i % N_MATS;
            int64_t rows = mats[m].rows / row_div;
            void *data = weight_new((enum pp_dtype)dt, rows, mats[m].cols, &seed);
            if (!data) {
                fprintf(stderr, "out of memory for %d layers of %s weights\n", layers, d);
                return 1;
            }
            w[ROWS][i] = (struct pp_weight){data, (enum pp_dtype)dt, rows, mats[m].cols};
            /* the backend's copy, as a model's weights are loaded */
            if (have[GROUPS] && be->ops->weight_load(be, &w[ROWS][i], 0, &w[GROUPS][i]) != PP_OK) {
                fprintf(stderr, "%s\n", pp_error_detail());
                return 1;
            }
            if (!have[ROWS])
                pp_free_huge(PP_MEM_WEIGHTS, data,
                             (size_t)(rows * pp_dtype_row_bytes(dt, mats[m].cols)));
            bytes += (double)rows * (double)pp_dtype_row_bytes(dt, mats[m].cols);
            flops_per_tok += 2.0 * (double)rows * (double)mats[m].cols;
        }
        for (int ti = 0; ti < n_tokens && n_res + n_lay <= 64; ti++) {
            int n = tokens[ti];
            for (int r = -1; r < reps; r++)
                for (int li = 0; li < n_lay; li++) {
                    int l = lays[(li + r + 1) % n_lay]; /* the first layout alternates */
                    double c0 = cpu_now(), t0 = pp_bench_now();
                    for (int i = 0; i < n_w; i++)
                        be->ops->matmul(be, y, x, &w[l][i], n);
                    if (r >= 0) {
                        times[l * reps + r] = pp_bench_now() - t0;
                        cpus[l * reps + r] = cpu_now() - c0;
                    }
                }
            for (int li = 0; li < n_lay; li++) {
                int l = lays[li];
                double *tl = times + l * reps, *cl = cpus + l * reps;
                qsort(tl, (size_t)reps, sizeof(double), pp_bench_cmp_double);
                qsort(cl, (size_t)reps, sizeof(double), pp_bench_cmp_double);
                struct result *o = &res[n_res++];
                snprintf(o->dtype, sizeof(o->dtype), "%s", d);
                o->tokens = n;
                o->layout = l;
                o->median_s = tl[reps / 2];
                o->best_s = tl[0];
                o->cpu_s = cl[reps / 2] / threads;
                o->bytes = bytes;
                printf("%-6s %6d %-6s %10.1f %10.3f %9.2f %9.2f %9.2f %9.1f\n", d, n,
                       layout_names[l], bytes / 1e6, o->median_s * 1e3, bytes / o->median_s / 1e9,
                       bytes / o->best_s / 1e9, bytes / o->cpu_s / 1e9,
                       flops_per_tok * n / o->median_s / 1e9);
            }
            if (n_lay == 2)
                printf("%-6s %6d groups / rows: %.3f (median passes' rates)\n", d, n,
                       res[n_res - 2].median_s / res[n_res - 1].median_s);
            if (beside)
                res[n_res - n_lay].beside =
                    run_beside(be, probe, threads, w[lays[0]], n_w, bytes, y, x, n, beside, d);
        }
        for (int i = 0; i < n_w; i++) {
            if (have[GROUPS])
                be->ops->weight_free(be, &w[GROUPS][i]);
            if (have[ROWS])
                pp_free_huge(PP_MEM_WEIGHTS, (void *)w[ROWS][i].data,
                             (size_t)(w[ROWS][i].rows *
                                      pp_dtype_row_bytes(w[ROWS][i].dtype, w[ROWS][i].cols)));
        }
    }
    double load1 = pp_bench_loadavg();
    double bw1 = pp_bench_read_bandwidth(threads), bw = bw0 > bw1 ? bw0 : bw1;
    printf("load average at the end %.2f, read bandwidth %.2f GB/s\n", load1, bw1 / 1e9);
    if (bw > 0.0)
        for (int i = 0; i < n_res; i++)
            printf("%-6s %6d tokens %-6s: %5.1f%% of the read bandwidth (median pass), %5.1f%% "
                   "(best)\n", res[i].dtype, res[i].tokens, layout_names[res[i].layout],
                   100.0 * res[i].bytes / res[i].median_s / bw,
                   100.0 * res[i].bytes / res[i].best_s / bw);
    be->ops->free(be);
    pp_bench_bw_free(probe);

    int rc = 0;
    if (json) {
        struct pp_json j;
        pp_json_init(&j);
        pp_json_begin_object(&j);
        pp_json_key(&j, "cpu");
        pp_json_cstring(&j, cpu_name);
        pp_json_key(&j, "threads");
        pp_json_int(&j, threads);
        pp_json_key(&j, "row_div");
        pp_json_int(&j, row_div);
        pp_json_key(&j, "layers");
        pp_json_int(&j, layers);
        pp_json_key(&j, "layout");
        pp_json_cstring(&j, layout);
        pp_bench_json_pair(&j, "read_bytes_per_s", bw0, bw1);
        pp_json_key(&j, "reps");
        pp_json_int(&j, reps);
        pp_bench_json_pair(&j, "load_average", load0, load1);
        pp_json_key(&j, "results");
        pp_json_begin_array(&j);
        for (int i = 0; i < n_res; i++) {
            pp_json_begin_object(&j);
            pp_json_key(&j, "dtype");
            pp_json_cstring(&j, res[i].dtype);
            pp_json_key(&j, "tokens");
            pp_json_int(&j, res[i].tokens);
            pp_json_key(&j, "layout");
            pp_json_cstring(&j, layout_names[res[i].layout]);
            pp_json_key(&j, "weight_bytes");
            pp_json_double(&j, res[i].bytes);
            pp_json_key(&j, "median_s");
            pp_json_double(&j, res[i].median_s);
            pp_json_key(&j, "best_s");
            pp_json_double(&j, res[i].best_s);
            pp_json_key(&j, "cpu_s_per_thread");
            pp_json_double(&j, res[i].cpu_s);
            pp_json_key(&j, "weights_bytes_s");
            pp_json_double(&j, res[i].bytes / res[i].median_s);
            if (beside && res[i].layout == lays[0]) {
                pp_json_key(&j, "beside_passes");
                pp_json_int(&j, beside);
                pp_json_key(&j, "beside_fraction_of_bound");
                pp_json_double(&j, res[i].beside.frac);
                pp_json_key(&j, "beside_fast_passes");
                pp_json_int(&j, res[i].beside.fast);
                pp_json_key(&j, "beside_fast_fraction_of_bound");
                pp_json_double(&j, res[i].beside.fast_frac);
            }
            pp_json_end_object(&j);
        }
        pp_json_end_array(&j);
        pp_json_end_object(&j);
        rc = pp_bench_write_json(json, "pp_bench_matmul", &j) ? 1 : 0;
        pp_json_free(&j);
    }
    free(x);
    free(y);
    free(times);
    free(cpus);
    return rc;

usage:
    fprintf(stderr, "usage: pp_bench_matmul [--threads N] [--dtypes f16,bf16,q8_0,f32] "
                    "[--tokens 1,2,4,8,12] [--reps R] [--row-div D] [--layers L] "
                    "[--layout groups|rows|both] [--beside P (0, or 3 to 4096)] [--json PATH]\n");
    return 2;
}
