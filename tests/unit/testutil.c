/* Test helpers. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *pp_test_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof(tmpl), "%s/pptest-XXXXXX", base && base[0] ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

void pp_test_rmdir(char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    free(dir);
}

char *pp_test_dir;

int pp_test_dir_setup(void **state)
{
    (void)state;
    pp_test_dir = pp_test_tmpdir();
    return 0;
}

int pp_test_dir_teardown(void **state)
{
    (void)state;
    pp_test_rmdir(pp_test_dir);
    pp_test_dir = NULL;
    return 0;
}

void pp_test_small_spec(struct pp_synth_spec *s)
{
    pp_synth_spec_defaults(s);
    s->dim = 64;
    s->n_layers = 3;
    s->n_heads = 4;
    s->n_kv_heads = 2;
    s->ffn_dim = 96;
    s->vocab_size = 300;
    s->max_context = 128;
}

void pp_test_write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n)
        assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

double pp_test_rel_err(const float *a, const float *ref, int rows, int cols)
{
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double d = 0, m = 0;
        for (int i = 0; i < cols; i++) {
            double x = fabs((double)a[r * cols + i] - ref[r * cols + i]);
            d = x > d ? x : d;
            m = fabs(ref[r * cols + i]) > m ? fabs(ref[r * cols + i]) : m;
        }
        worst = d / m > worst ? d / m : worst;
    }
    return worst;
}

int32_t pp_test_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

void pp_test_engine_open(struct pp_test_engine *e, const char *path, int32_t first, int32_t last,
                         int32_t tp, int32_t ep, int threads, int32_t window)
{
    memset(e, 0, sizeof(*e));
    e->tp = tp;
    if (pp_model_open(path, first, last, &e->m) != PP_OK)
        fail_msg("%s: %s", path, pp_error_detail());
    assert_int_equal(pp_backend_cpu_new_workers(threads, tp, e->bes), PP_OK);
    struct pp_executor_opts o = {0};
    o.max_batch_tokens = window;
    o.max_seqs = 8;
    o.ep = ep;
    if (pp_executor_new_workers(e->m, e->bes, tp, &o, &e->ex) != PP_OK)
        fail_msg("%s tp %d ep %d: %s", path, tp, ep, pp_error_detail());
    assert_int_equal(pp_executor_workers(e->ex), tp);
}

void pp_test_engine_close(struct pp_test_engine *e)
{
    pp_executor_free(e->ex);
    pp_backend_free_all(e->bes, e->tp);
    pp_model_free(e->m);
}

void pp_test_moe_spec(struct pp_synth_spec *s, const char *arch, int32_t n, int32_t k)
{
    pp_test_small_spec(s);
    snprintf(s->arch, sizeof(s->arch), "%s", arch);
    s->n_experts = n;
    s->n_experts_used = k;
}
