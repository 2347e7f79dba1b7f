/* Model identity: stable for the same model, independent of HF sharding, different for another
 * seed, format or a changed weight. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/identity.h"
#include "testutil.h"

static char *dir;

static void write_model(const char *name, uint64_t seed, int shards, int gguf)
{
    struct pp_synth_spec s;
    pp_test_small_spec(&s);
    s.seed = seed;
    s.shards = shards;
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    assert_int_equal(gguf ? pp_synth_write_gguf(&s, path) : pp_synth_write_hf(&s, path), PP_OK);
}

static void id_of(const char *name, char out[PP_MODEL_ID_LEN])
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    assert_int_equal(pp_model_identity(path, out), PP_OK);
}

static void test_identity(void **state)
{
    (void)state;
    write_model("a.gguf", 1, 1, 1);
    write_model("b.gguf", 2, 1, 1);
    write_model("a-hf", 1, 1, 0);
    write_model("a-hf3", 1, 3, 0);
    char a[PP_MODEL_ID_LEN], a2[PP_MODEL_ID_LEN], b[PP_MODEL_ID_LEN], h[PP_MODEL_ID_LEN],
        h3[PP_MODEL_ID_LEN];
    id_of("a.gguf", a);
    id_of("a.gguf", a2);
    id_of("b.gguf", b);
    id_of("a-hf", h);
    id_of("a-hf3", h3);
    assert_int_equal(strlen(a), 6 + 32);
    assert_memory_equal(a, "ppid1-", 6);
    assert_string_equal(a, a2);     /* stable */
    assert_string_not_equal(a, b);  /* another seed */
    assert_string_not_equal(a, h);  /* another format: its RoPE layout changes the bits */
    assert_string_equal(h, h3);     /* sharding does not matter */

    /* one changed weight byte at the start of a tensor's data */
    char path[600];
    snprintf(path, sizeof(path), "%s/a.gguf", dir);
    struct pp_gguf *g;
    assert_int_equal(pp_gguf_open(path, &g), PP_OK);
    const struct pp_tensor *t = pp_gguf_tensor(g, "blk.1.ffn_up.weight");
    assert_non_null(t);
    long off = (long)((const unsigned char *)t->data - g->file.data);
    pp_gguf_free(g);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    fclose(f);
    char changed[PP_MODEL_ID_LEN];
    id_of("a.gguf", changed);
    assert_string_not_equal(a, changed);

    char missing[PP_MODEL_ID_LEN];
    assert_int_equal(pp_model_identity("/nonexistent.gguf", missing), PP_ERR_IO);
}

int main(void)
{
    dir = pp_test_tmpdir();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_identity)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pp_test_rmdir(dir);
    return rc;
}
