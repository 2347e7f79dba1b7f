/* pp_bench_tp: tensor parallelism on this machine's cores.
 *
 *   pp_bench_tp [--model PATH] [--prompt N] [--decode N] [--rounds N] [--json PATH]
 *
 * Runs one model (default: the tinyllama-shaped f16 GGUF that pp_bench uses, written by the synth
 * API when missing) in three layouts, interleaved round by round so that a busy neighbour slows all
 * of them alike: TP 1 on one thread, TP 1 on two threads (the kernels' own threading), TP 2 on two
 * threads (two workers of one thread each). For each: prefill tokens/s of one prompt (best pass),
 * greedy decode tokens/s (median step), and bytes all-reduced per token. Prints TP 2 against TP 1
 * on one core (the goal: prefill >= 1.6x) and against TP 1 on two threads. */
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

#define N_LAYOUTS 3

struct layout {
    const char *name;
    int threads;
    int tp;
    double prefill_tok_s; /* best over rounds */
    double decode_tok_s;  /* best round's median step */
    double reduced_bytes_per_token;
};

struct opts {
    const char *model;
    int prompt;
    int decode;
    int rounds;
    const char *json;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double loadavg(void)
{
    double l = -1.0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1.0;
        fclose(f);
    }
    return l;
}

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static pp_status ensure_default_model(char *path, size_t cap)
{
    const char *dir = "/tmp/pp_bench_models";
    snprintf(path, cap, "%s/f16/model.gguf", dir);
    struct stat st;
    if (stat(path, &st) == 0)
        return PP_OK;
    mkdir(dir, 0755);
    if (mkdir("/tmp/pp_bench_models/f16", 0755) != 0 && errno != EEXIST)
        return pp_error(PP_ERR_IO, "cannot create /tmp/pp_bench_models/f16");
    struct pp_synth_spec spec;
    pp_status s = pp_synth_shape("tinyllama", &spec);
    if (s != PP_OK)
        return s;
    spec.dtype = PP_DTYPE_F16;
    fprintf(stderr, "writing %s ...\n", path);
    return pp_synth_write_gguf(&spec, path);
}

/* One round of one layout: a warm-up and a timed prefill, then o->decode greedy steps. */
static pp_status run_round(const struct opts *o, const struct pp_model *m, struct layout *l)
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
    int32_t tok = argmax(logits, c->vocab_size);
    for (int i = 0; i < o->decode; i++) {
        struct pp_exec_seq seq = {1, o->prompt + i, 1, 1};
        struct pp_exec_batch b = {1, &seq, &tok, NULL};
        double t0 = pp_bench_now();
        if ((st = pp_executor_forward(ex, &b, NULL, logits)) != PP_OK)
            goto out;
        steps[i] = pp_bench_now() - t0;
        tok = argmax(logits, c->vocab_size);
    }
    l->reduced_bytes_per_token = (double)(pp_executor_bytes_reduced(ex) - reduced0) / o->decode;
    qsort(steps, (size_t)o->decode, sizeof(double), cmp_double);
    if (1.0 / steps[o->decode / 2] > l->decode_tok_s)
        l->decode_tok_s = 1.0 / steps[o->decode / 2];
out:
    pp_executor_free(ex);
    pp_backend_free_all(bes, 8);
    free(logits);
    free(ids);
    free(steps);
    return st;
}

static void write_json(const struct opts *o, const char *path, const struct layout *ls,
                       double load0, double load1)
{
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_key(&j, "model");
    pp_json_cstring(&j, path);
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
    pp_json_key(&j, "layouts");
    pp_json_begin_array(&j);
    for (int i = 0; i < N_LAYOUTS; i++) {
        pp_json_begin_object(&j);
        pp_json_key(&j, "name");
        pp_json_cstring(&j, ls[i].name);
        pp_json_key(&j, "threads");
        pp_json_int(&j, ls[i].threads);
        pp_json_key(&j, "tp");
        pp_json_int(&j, ls[i].tp);
        pp_json_key(&j, "prefill_tok_s");
        pp_json_double(&j, ls[i].prefill_tok_s);
        pp_json_key(&j, "decode_tok_s");
        pp_json_double(&j, ls[i].decode_tok_s);
        pp_json_key(&j, "all_reduced_bytes_per_token");
        pp_json_double(&j, ls[i].reduced_bytes_per_token);
        pp_json_end_object(&j);
    }
    pp_json_end_array(&j);
    pp_json_key(&j, "prefill_tp2_over_tp1_1thread");
    pp_json_double(&j, ls[2].prefill_tok_s / ls[0].prefill_tok_s);
    pp_json_key(&j, "decode_tp2_over_tp1_1thread");
    pp_json_double(&j, ls[2].decode_tok_s / ls[0].decode_tok_s);
    pp_json_key(&j, "prefill_tp2_over_tp1_2threads");
    pp_json_double(&j, ls[2].prefill_tok_s / ls[1].prefill_tok_s);
    pp_json_key(&j, "decode_tp2_over_tp1_2threads");
    pp_json_double(&j, ls[2].decode_tok_s / ls[1].decode_tok_s);
    pp_json_end_object(&j);
    FILE *f = fopen(o->json, "w");
    if (!f || fprintf(f, "%s\n", j.out.data ? j.out.data : "{}") < 0 || fclose(f) != 0)
        fprintf(stderr, "pp_bench_tp: cannot write %s\n", o->json);
    pp_json_free(&j);
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){NULL, 128, 32, 2, NULL};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return -1;
        if (strcmp(a, "--model") == 0)
            o->model = v;
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

int main(int argc, char **argv)
{
    struct opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: pp_bench_tp [--model PATH] [--prompt N] [--decode N] "
                        "[--rounds N] [--json PATH]\n");
        return 2;
    }
    char path[4096];
    pp_status st = PP_OK;
    if (o.model)
        snprintf(path, sizeof(path), "%s", o.model);
    else
        st = ensure_default_model(path, sizeof(path));
    struct pp_model *m = NULL;
    if (st != PP_OK || (st = pp_model_open(path, 0, -1, &m)) != PP_OK) {
        fprintf(stderr, "pp_bench_tp: %s: %s\n", pp_strerror(st), pp_error_detail());
        return 1;
    }
    struct layout ls[N_LAYOUTS] = {
        {"tp1_1thread", 1, 1, 0, 0, 0},
        {"tp1_2threads", 2, 1, 0, 0, 0},
        {"tp2_2threads", 2, 2, 0, 0, 0},
    };
    double load0 = loadavg();
    printf("pp_bench_tp: %s, prompt %d, decode %d, %d rounds, load %.2f\n", path, o.prompt,
           o.decode, o.rounds, load0);
    for (int r = 0; r < o.rounds && st == PP_OK; r++)
        for (int i = 0; i < N_LAYOUTS && st == PP_OK; i++)
            st = run_round(&o, m, &ls[i]);
    double load1 = loadavg();
    if (st != PP_OK) {
        fprintf(stderr, "pp_bench_tp: %s: %s\n", pp_strerror(st), pp_error_detail());
        pp_model_free(m);
        return 1;
    }
    printf("%-14s %7s %3s %12s %11s %18s\n", "layout", "threads", "tp", "prefill t/s",
           "decode t/s", "all-reduced B/tok");
    for (int i = 0; i < N_LAYOUTS; i++)
        printf("%-14s %7d %3d %12.1f %11.2f %18.0f\n", ls[i].name, ls[i].threads, ls[i].tp,
               ls[i].prefill_tok_s, ls[i].decode_tok_s, ls[i].reduced_bytes_per_token);
    printf("TP 2 (2 cores) / TP 1 (1 core): prefill %.3fx (goal >= 1.6), decode %.3fx\n",
           ls[2].prefill_tok_s / ls[0].prefill_tok_s, ls[2].decode_tok_s / ls[0].decode_tok_s);
    printf("TP 2 / TP 1 on 2 threads:        prefill %.3fx, decode %.3fx\n",
           ls[2].prefill_tok_s / ls[1].prefill_tok_s, ls[2].decode_tok_s / ls[1].decode_tok_s);
    printf("load average %.2f before, %.2f after\n", load0, load1);
    if (o.json)
        write_json(&o, path, ls, load0, load1);
    pp_model_free(m);
    return 0;
}
