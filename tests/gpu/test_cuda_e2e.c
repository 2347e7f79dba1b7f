/* End-to-end logits, CUDA backend against CPU backend: for each model given (GGUF files written by
 * `ppserve synth`), two executors run the same script of batches: two prompts prefilled together,
 * decode steps of both (every step feeds both engines the CPU's greedy token, so they see the same
 * ids), then a third prompt longer than the executor's window prefilled beside a decode step.
 * Every logits row is compared: relative error max|gpu - cpu| / max|cpu| within the tolerance
 * (--tol X for the models after it, default 3e-2: the GPU's prefill matmuls round activations to
 * 16 bits; f32 and Q8_0 models also have their weights rounded to bf16), and the greedy
 * token is reported (a near tie may differ, so it is counted, not required).
 *
 * Exit status: 0 all within tolerance, 1 not, 3 a model could not be run (an engine error, named on
 * stderr), 77 no usable GPU (nothing run), 2 bad usage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "model/executor.h"
#include "model/model.h"

#define MAX_ROWS 4 /* logits rows per batch at most */

struct engine {
    struct pp_backend *be;
    struct pp_executor *ex;
};

struct stats {
    double worst;
    int rows;
    int greedy_same;
};

/* Greedy: the CPU backend's top-1 (ties to the lower id), as sampling takes it. */
static int argmax(struct engine *cpu, const float *x, int n)
{
    int32_t id = 0;
    float v;
    if (cpu->be->ops->topk(cpu->be, &id, &v, x, 1, n, 1) != PP_OK)
        return -1;
    return id;
}

/* Runs batch on both engines; compares the logits rows; returns the CPU's logits. */
static int step(struct engine *cpu, struct engine *gpu, const struct pp_exec_batch *b, int n_want,
                int vocab, float *lc, float *lg, struct stats *st, const char *what)
{
    pp_status s1 = pp_executor_forward(cpu->ex, b, NULL, lc);
    if (s1 != PP_OK) {
        fprintf(stderr, "cpu forward (%s): %s\n", what, pp_error_detail());
        return -1;
    }
    pp_status s2 = pp_executor_forward(gpu->ex, b, NULL, lg);
    if (s2 != PP_OK) {
        fprintf(stderr, "cuda forward (%s): %s\n", what, pp_error_detail());
        return -1;
    }
    for (int r = 0; r < n_want; r++) {
        const float *c = lc + (int64_t)r * vocab, *g = lg + (int64_t)r * vocab;
        double md = 0, mr = 0;
        int finite = 1;
        for (int i = 0; i < vocab; i++) {
            if (!isfinite(g[i]))
                finite = 0;
            double d = fabs((double)g[i] - c[i]);
            md = d > md ? d : md;
            mr = fabs(c[i]) > mr ? fabs(c[i]) : mr;
        }
        double rel = finite ? md / (mr > 0 ? mr : 1) : INFINITY;
        st->worst = rel > st->worst ? rel : st->worst;
        st->rows++;
        st->greedy_same += argmax(cpu, c, vocab) == argmax(cpu, g, vocab);
    }
    return 0;
}

static int run_model(const char *path, double tol, FILE *json, int first)
{
    struct pp_model *m = NULL;
    struct engine cpu = {0}, gpu = {0};
    struct stats st = {0, 0, 0};
    float *lc = NULL, *lg = NULL;
    int32_t *toks = NULL;
    int rc = 3, reported = 0;
    if (pp_model_open(path, 0, -1, &m) != PP_OK) {
        fprintf(stderr, "%s: %s\n", path, pp_error_detail());
        goto done;
    }
    int vocab = m->cfg.vocab_size;
    struct pp_executor_opts eo = {0};
    eo.max_batch_tokens = 64; /* the long prompt runs in windows */
    eo.max_seqs = 8;
    eo.max_context = m->cfg.max_context < 512 ? m->cfg.max_context : 512;
    if (pp_backend_cpu_new(8, &cpu.be) != PP_OK ||
        pp_executor_new(m, cpu.be, &eo, &cpu.ex) != PP_OK ||
        pp_backend_cuda_new(0, 0, &gpu.be) != PP_OK ||
        pp_executor_new(m, gpu.be, &eo, &gpu.ex) != PP_OK) {
        fprintf(stderr, "%s: engines: %s\n", path, pp_error_detail());
        goto done;
    }
    lc = malloc((size_t)MAX_ROWS * vocab * sizeof(float));
    lg = malloc((size_t)MAX_ROWS * vocab * sizeof(float));
    int32_t long_len = eo.max_context - 40 < 150 ? eo.max_context - 40 : 150;
    toks = malloc((size_t)(long_len + 64) * sizeof(int32_t));
    if (!lc || !lg || !toks || long_len < 8) {
        fprintf(stderr, "%s: no memory, or a context under 48\n", path);
        goto done;
    }
    uint32_t r = 12345u;
    for (int i = 0; i < long_len + 64; i++) {
        r = r * 1664525u + 1013904223u;
        toks[i] = (int32_t)(1 + (r >> 8) % (uint32_t)(vocab - 1));
    }
    /* two prompts (37 and 5 tokens) prefilled together */
    struct pp_exec_seq s2[2] = {{1, 0, 37, 1}, {2, 0, 5, 1}};
    struct pp_exec_batch b = {2, s2, toks, NULL};
    if (step(&cpu, &gpu, &b, 2, vocab, lc, lg, &st, "prefill") != 0)
        goto done;
    int32_t pos[2] = {37, 5};
    /* decode both, fed the CPU's greedy tokens, sequence 1 past position 48 (where a sliding
     * window of 48 starts to hide keys from the decode kernel) */
    for (int k = 0; k < 16; k++) {
        int32_t next[2] = {argmax(&cpu, lc, vocab), argmax(&cpu, lc + vocab, vocab)};
        struct pp_exec_seq d[2] = {{1, pos[0], 1, 1}, {2, pos[1], 1, 1}};
        struct pp_exec_batch db = {2, d, next, NULL};
        if (step(&cpu, &gpu, &db, 2, vocab, lc, lg, &st, "decode") != 0)
            goto done;
        pos[0]++;
        pos[1]++;
    }
    /* a long prompt in windows of 64 rows, beside a decode step of sequence 1 */
    int32_t next = argmax(&cpu, lc, vocab);
    int32_t *mixed = malloc((size_t)(long_len + 1) * sizeof(int32_t));
    if (!mixed)
        goto done;
    mixed[0] = next;
    memcpy(mixed + 1, toks + 40, (size_t)long_len * sizeof(int32_t));
    struct pp_exec_seq s3[2] = {{1, pos[0], 1, 1}, {3, 0, long_len, 1}};
    struct pp_exec_batch mb = {2, s3, mixed, NULL};
    int bad = step(&cpu, &gpu, &mb, 2, vocab, lc, lg, &st, "long prefill");
    free(mixed);
    if (bad)
        goto done;
    rc = st.worst <= tol ? 0 : 1;
    printf("%-60s rows %3d  max rel err %.3g (tolerance %.3g)  greedy same %d/%d  %s\n", path,
           st.rows, st.worst, tol, st.greedy_same, st.rows, rc == 0 ? "PASS" : "FAIL");
    if (json)
        fprintf(json, "%s  {\"model\": \"%s\", \"rows\": %d, \"max_rel_err\": %.6g, "
                "\"tolerance\": %.6g, \"greedy_same\": %d, \"pass\": %s}", first ? "" : ",\n",
                path, st.rows, st.worst, tol, st.greedy_same, rc == 0 ? "true" : "false");
    reported = 1;
done:
    if (!reported) {
        printf("%-60s rows %3d compared, then an error  FAIL\n", path, st.rows);
        if (json)
            fprintf(json, "%s  {\"model\": \"%s\", \"error\": true, \"rows\": %d, "
                    "\"max_rel_err\": %.6g, \"pass\": false}", first ? "" : ",\n", path, st.rows,
                    st.worst);
    }
    pp_executor_free(cpu.ex);
    pp_executor_free(gpu.ex);
    if (cpu.be)
        cpu.be->ops->free(cpu.be);
    if (gpu.be)
        gpu.be->ops->free(gpu.be);
    pp_model_free(m);
    free(lc);
    free(lg);
    free(toks);
    return rc;
}

int main(int argc, char **argv)
{
    /* --json FILE anywhere; --tol X applies to the models after it */
    const char *json_path = NULL;
    int n_models = 0;
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "--tol") == 0) && i + 1 < argc) {
            if (argv[i][2] == 'j')
                json_path = argv[i + 1];
            else if (!(atof(argv[i + 1]) > 0))
                n_models = -1000;
            i++;
        } else if (strncmp(argv[i], "--", 2) == 0) {
            n_models = -1000;
        } else {
            n_models++;
        }
    }
    if (n_models < 1) {
        fprintf(stderr, "usage: test_cuda_e2e [--json FILE] [--tol X] MODEL.gguf... "
                "[--tol Y MODEL.gguf...]\n");
        return 2;
    }
    struct pp_backend *probe = NULL;
    if (pp_backend_cuda_new(0, 0, &probe) != PP_OK) {
        fprintf(stderr, "test_cuda_e2e: no usable GPU, nothing run: %s\n", pp_error_detail());
        return 77;
    }
    probe->ops->free(probe);
    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !json) {
        fprintf(stderr, "test_cuda_e2e: cannot write %s\n", json_path);
        return 1;
    }
    if (json)
        fprintf(json, "{\"models\": [\n");
    int failed = 0, broke = 0, first = 1;
    double tol = 3e-2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "--tol") == 0) {
            if (argv[i][2] == 't')
                tol = atof(argv[i + 1]);
            i++;
            continue;
        }
        int rc = run_model(argv[i], tol, json, first);
        failed |= rc != 0;
        broke |= rc == 3;
        first = 0;
    }
    if (json) {
        fprintf(json, "\n]}\n");
        if (fclose(json) != 0)
            failed = 1;
    }
    printf("%s\n", failed ? "SOME MODELS FAILED" : "ALL MODELS PASS");
    return broke ? 3 : failed ? 1 : 0;
}
