/* Test helpers. */
#include "testutil.h"

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
