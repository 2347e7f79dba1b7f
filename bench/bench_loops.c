/* pp_bench_loops: the matmul's inner loops alone (kernels/cpu/simd.h), one thread, on weights
 * small enough to stay in L2, laid out as the backend's copy (row groups): GB/s of weights per
 * dtype and token count for this CPU's table and for the portable one, and their ratio, measured
 * in one run. No thread pool, no per-call quantization or padding of the activations (done once
 * before timing, as matmul.c does per call) and no memory traffic, so on a shared host whose
 * memory bandwidth drifts by tens of percent these figures repeat to a few percent where
 * pp_bench_matmul's --row-div ones do not: a change to a tile shows here first
 * (docs/benchmarks.md). Not run by ctest.
 *
 *   pp_bench_loops [--dtypes f16,bf16,q8_0,f32] [--tokens 1,2,4,20] [--kib K] [--cols C]
 *                  [--json PATH]
 *
 * --kib: the weight's size (default 512 KiB; its rows a multiple of 12), --cols its row length
 * (default 2048, a multiple of 32). Each figure is the best of 7 passes of about 20 ms. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/json_write.h"
#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/dtype.h"

#define PASSES 7
#define PASS_S 0.02
#define MAX_RESULTS 64

struct loops_result {
    enum pp_dtype dtype;
    int tokens;
    int64_t rows;
    double fast_s, port_s; /* best seconds per call */
};

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* One matmul's operands as the backend holds them: the weight in row groups, the activations
 * (padded or quantized) ready for the loops, and per-call scratch. */
struct loops_case {
    struct pp_mm_args a;
    struct pp_mm_scratch s;
    void *w, *x, *act;
};

static int case_new(struct loops_case *c, enum pp_dtype dt, int64_t rows, int64_t cols,
                    int64_t n, uint64_t *seed)
{
    memset(c, 0, sizeof(*c));
    int64_t rb = pp_dtype_row_bytes(dt, cols);
    void *file = malloc((size_t)(rows * rb));
    float *row = malloc(sizeof(float) * (size_t)cols);
    int64_t ldx = n > PP_MM_DIRECT_MAX_TOKENS && cols % 256 == 0 ? cols + PP_MM_X_PAD : cols;
    c->w = pp_alloc_aligned(PP_MEM_WEIGHTS, (size_t)(rows * rb));
    c->x = pp_alloc_aligned(PP_MEM_ACTIVATIONS, sizeof(float) * (size_t)(n * ldx));
    /* the int8 activations, then their pairs */
    int64_t pairs_at = pp__q8_pairs_offset(n, cols);
    c->act =
        pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(pairs_at + pp__q8_pairs_bytes(n, cols)));
    c->s.row = pp_alloc_aligned(PP_MEM_ACTIVATIONS, sizeof(float) * (size_t)cols);
    c->s.panel = pp_alloc_aligned(PP_MEM_ACTIVATIONS, sizeof(float) * PP_MM_PANEL_ROWS * PP_MM_KC);
    c->s.acc = pp_alloc_aligned(PP_MEM_ACTIVATIONS, sizeof(float) * PP_MM_ACC_CAP);
    c->s.q8_split = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)pp__q8_split_bytes(cols));
    float *y = pp_alloc_aligned(PP_MEM_ACTIVATIONS, sizeof(float) * (size_t)(n * rows));
    if (!file || !row || !c->w || !c->x || !c->act || !c->s.row || !c->s.panel || !c->s.acc ||
        !c->s.q8_split || !y) {
        free(file);
        free(row);
        pp_free(PP_MEM_ACTIVATIONS, y);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++)
            row[i] = (float)(rng(seed) & 0xffff) / 32768.0f - 1.0f;
        char *dst = (char *)file + r * rb;
        if (dt == PP_DTYPE_Q8_0)
            pp_quantize_q8_0(dst, row, cols);
        else if (dt == PP_DTYPE_F32)
            memcpy(dst, row, sizeof(float) * (size_t)cols);
        else
            for (int64_t i = 0; i < cols; i++) {
                uint16_t h = dt == PP_DTYPE_F16 ? pp_f32_to_f16(row[i]) : pp_f32_to_bf16(row[i]);
                memcpy(dst + i * 2, &h, 2);
            }
    }
    pp__row_groups_pack(c->w, file, dt, rows, cols);
    float *x = c->x;
    for (int64_t i = 0; i < n * ldx; i++)
        x[i] = (float)(rng(seed) & 0xffff) / 16384.0f - 2.0f;
    c->a = (struct pp_mm_args){y, x, ldx, c->w, dt, rows, cols, n, rb, 1,
                               pp_simd_prefetch_l2()};
    c->a.amd_tiles = pp_simd_amd_tiles();
    if (dt == PP_DTYPE_Q8_0) {
        const struct pp_simd *simd = pp_simd_get();
        pp__q8_act_bind(&c->a, c->act);
        pp__q8_act_fill(&c->a, simd->q8_act, 0, n);
        /* the pair tiles' layout, where the backend would build it */
        pp_q8_pairs_fn pairs = pp_simd_q8_pairs(simd);
        if (pp__q8_pairs_wanted(pairs, n)) {
            pp__q8_pairs_bind(&c->a, (char *)c->act + pairs_at);
            pp__q8_pairs_fill(&c->a, pairs, 0, n);
        }
    }
    free(file);
    free(row);
    return 0;
}

static void case_free(struct loops_case *c)
{
    pp_free(PP_MEM_ACTIVATIONS, c->a.y);
    pp_free(PP_MEM_WEIGHTS, c->w);
    pp_free(PP_MEM_ACTIVATIONS, c->x);
    pp_free(PP_MEM_ACTIVATIONS, c->act);
    pp_free(PP_MEM_ACTIVATIONS, c->s.row);
    pp_free(PP_MEM_ACTIVATIONS, c->s.panel);
    pp_free(PP_MEM_ACTIVATIONS, c->s.acc);
    pp_free(PP_MEM_ACTIVATIONS, c->s.q8_split);
}

/* Best seconds per call of one table's loops over all the rows. */
static double time_loops(const struct pp_simd *t, const struct loops_case *c)
{
    pp_mm_rows_fn fn = c->a.dtype == PP_DTYPE_Q8_0 ? t->matmul_q8 : t->matmul_rows;
    int64_t calls = 1;
    for (;;) { /* calibrate: a pass of about PASS_S */
        double t0 = pp_bench_now();
        for (int64_t i = 0; i < calls; i++)
            fn(&c->a, 0, c->a.rows, &c->s);
        double dt = pp_bench_now() - t0;
        if (dt >= PASS_S / 4 || calls >= (1 << 24)) {
            calls = dt > 0 ? (int64_t)(calls * PASS_S / dt) + 1 : calls;
            break;
        }
        calls *= 4;
    }
    double best = 1e30;
    for (int p = 0; p < PASSES; p++) {
        double t0 = pp_bench_now();
        for (int64_t i = 0; i < calls; i++)
            fn(&c->a, 0, c->a.rows, &c->s);
        double dt = (pp_bench_now() - t0) / (double)calls;
        if (dt < best)
            best = dt;
    }
    return best;
}

static int parse_ints(const char *s, int *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 128)
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return n;
}

static int write_json(const char *path, const struct loops_result *res, int n_res,
                      int64_t cols, const char *isa, const char *cpu_name)
{
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_key(&j, "cpu");
    pp_json_cstring(&j, cpu_name);
    pp_json_key(&j, "kernels");
    pp_json_cstring(&j, isa);
    pp_json_key(&j, "cols");
    pp_json_int(&j, cols);
    pp_json_key(&j, "results");
    pp_json_begin_array(&j);
    for (int i = 0; i < n_res; i++) {
        const struct loops_result *r = &res[i];
        double bytes = (double)(r->rows * pp_dtype_row_bytes(r->dtype, cols));
        pp_json_begin_object(&j);
        pp_json_key(&j, "dtype");
        pp_json_cstring(&j, pp_dtype_name(r->dtype));
        pp_json_key(&j, "tokens");
        pp_json_int(&j, r->tokens);
        pp_json_key(&j, "rows");
        pp_json_int(&j, r->rows);
        pp_json_key(&j, "weight_bytes");
        pp_json_double(&j, bytes);
        pp_json_key(&j, "fast_s");
        pp_json_double(&j, r->fast_s);
        pp_json_key(&j, "portable_s");
        pp_json_double(&j, r->port_s);
        pp_json_key(&j, "fast_over_portable");
        pp_json_double(&j, r->port_s / r->fast_s);
        pp_json_end_object(&j);
    }
    pp_json_end_array(&j);
    pp_json_end_object(&j);
    int bad = pp_bench_write_json(path, "pp_bench_loops", &j);
    pp_json_free(&j);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *dtypes = "f16,bf16,q8_0,f32", *json = NULL;
    int tokens[16], n_tok = parse_ints("1,2,4,20", tokens, 16);
    long kib = 512, cols = 2048;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            goto usage;
        if (strcmp(a, "--dtypes") == 0)
            dtypes = v;
        else if (strcmp(a, "--tokens") == 0)
            n_tok = parse_ints(v, tokens, 16);
        else if (strcmp(a, "--kib") == 0)
            kib = strtol(v, NULL, 10);
        else if (strcmp(a, "--cols") == 0)
            cols = strtol(v, NULL, 10);
        else if (strcmp(a, "--json") == 0)
            json = v;
        else
            goto usage;
        i++;
    }
    if (n_tok < 1 || kib < 16 || kib > 65536 || cols < 32 || cols > 65536 || cols % 32 != 0)
        goto usage;

    enum pp_dtype dts[PP_DTYPE_COUNT * 4];
    int n_dt = 0;
    char list[64];
    snprintf(list, sizeof(list), "%s", dtypes);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        int parsed = pp_dtype_parse(name);
        if (parsed < 0 || n_dt == (int)(sizeof(dts) / sizeof(dts[0]))) {
            fprintf(stderr, "pp_bench_loops: dtype '%s': expected f32, f16, bf16 or q8_0\n", name);
            return 2;
        }
        dts[n_dt++] = (enum pp_dtype)parsed;
    }

    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    printf("pp_bench_loops: one thread, %ld KiB of weights in row groups, cols %ld, kernels %s, "
           "prefetch into %s; best of %d passes\n",
           kib, cols, fast->name, pp_simd_prefetch_l2() ? "L2" : "L1", PASSES);
    char cpu_name[160];
    pp_bench_cpu_name(cpu_name, sizeof(cpu_name));
    printf("cpu: %s\n", cpu_name);
    printf("%-6s %6s %6s %12s %12s %10s\n", "dtype", "tokens", "rows", "fast GB/s",
           "portable GB/s", "fast/port");
    struct loops_result res[MAX_RESULTS];
    int n_res = 0;
    uint64_t seed = 42;
    for (int d = 0; d < n_dt; d++) {
        enum pp_dtype dt = dts[d];
        int64_t rb = pp_dtype_row_bytes(dt, cols);
        int64_t rows = kib * 1024 / rb / 12 * 12;
        if (rows < 12)
            rows = 12;
        for (int k = 0; k < n_tok && n_res < MAX_RESULTS; k++) {
            struct loops_case c;
            if (case_new(&c, dt, rows, cols, tokens[k], &seed) != 0) {
                fprintf(stderr, "pp_bench_loops: out of memory\n");
                return 1;
            }
            struct loops_result *r = &res[n_res++];
            *r = (struct loops_result){dt, tokens[k], rows, time_loops(fast, &c),
                                       time_loops(port, &c)};
            double bytes = (double)(rows * rb);
            printf("%-6s %6d %6lld %12.2f %12.2f %10.2f\n", pp_dtype_name(dt), r->tokens,
                   (long long)rows, bytes / r->fast_s / 1e9, bytes / r->port_s / 1e9,
                   r->port_s / r->fast_s);
            fflush(stdout);
            case_free(&c);
        }
    }
    return json ? write_json(json, res, n_res, cols, fast->name, cpu_name) : 0;

usage:
    fprintf(stderr, "usage: pp_bench_loops [--dtypes f16,bf16,q8_0,f32] [--tokens 1,2,4,20] "
                    "[--kib K (16..65536)] [--cols C (a multiple of 32)] [--json PATH]\n");
    return 2;
}
