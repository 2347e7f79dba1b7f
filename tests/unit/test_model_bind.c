/* Binding a model's tensors (model/model.c) checks their data where the kernels rely on it: a Q8_0
 * block whose f16 scale is infinite or NaN is refused at open with the tensor, row and columns; the
 * largest finite and negative zero scales are accepted. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth-impl.h"
#include "testutil.h"

static char base[600];

static int setup(void **state)
{
    if (pp_test_dir_setup(state) != 0)
        return -1;
    struct pp_synth_spec s;
    pp_test_small_spec(&s);
    s.dtype = PP_DTYPE_Q8_0;
    s.seed = 3;
    snprintf(base, sizeof(base), "%s/q8.gguf", pp_test_dir);
    return pp_synth_write_gguf(&s, base) == PP_OK ? 0 : -1;
}

/* A copy of the model at name with the scale of Q8_0 block `block` of tensor `tensor` set to h. */
static void patched(const char *name, const char *tensor, int64_t block, uint16_t h, char *out,
                    size_t cap)
{
    struct pp_gguf *g;
    assert_int_equal(pp_gguf_open(base, &g), PP_OK);
    const struct pp_tensor *t = pp_gguf_tensor(g, tensor);
    assert_non_null(t);
    assert_int_equal(t->dtype, PP_DTYPE_Q8_0);
    size_t n = g->file.size;
    uint8_t *p = malloc(n);
    assert_non_null(p);
    memcpy(p, g->file.data, n);
    size_t at = (size_t)((const uint8_t *)t->data - (const uint8_t *)g->file.data) +
                (size_t)block * PP_Q8_0_BYTES;
    memcpy(p + at, &h, 2);
    pp_gguf_free(g);
    snprintf(out, cap, "%s/%s.gguf", pp_test_dir, name);
    pp_test_write_file(out, p, n);
    free(p);
}

static void expect_refused(const char *path, const char *part1, const char *part2)
{
    struct pp_model *m = NULL;
    pp_status st = pp_model_open(path, 0, -1, &m);
    if (st != PP_ERR_FORMAT || !strstr(pp_error_detail(), part1) ||
        !strstr(pp_error_detail(), part2) || !strstr(pp_error_detail(), "infinite or NaN"))
        fail_msg("%s: got status %d, message \"%s\"; expected PP_ERR_FORMAT with \"%s\" and "
                 "\"%s\"",
                 path, st, pp_error_detail(), part1, part2);
    assert_null(m);
}

static void test_nonfinite_q8_0_scale_refused(void **state)
{
    (void)state;
    char p[700];
    /* the small spec's dim is 64: two blocks per row, so block 5 is row 2, columns 32-63 */
    patched("inf", "blk.1.attn_v.weight", 5, 0x7c00, p, sizeof(p));
    expect_refused(p, "tensor blk.1.attn_v.weight: row 2, columns 32-63", p);
    patched("nan", "blk.0.ffn_down.weight", 0, 0xfe00, p, sizeof(p));
    expect_refused(p, "tensor blk.0.ffn_down.weight: row 0, columns 0-31", "expected a finite");
    /* the edges that are finite */
    const uint16_t fine[] = {0x7bff, 0xfbff, 0x8000, 0x0001};
    for (int i = 0; i < 4; i++) {
        patched("fine", "blk.1.attn_v.weight", 5, fine[i], p, sizeof(p));
        struct pp_model *m = NULL;
        assert_int_equal(pp_model_open(p, 0, -1, &m), PP_OK);
        pp_model_free(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonfinite_q8_0_scale_refused),
    };
    return cmocka_run_group_tests(tests, setup, pp_test_dir_teardown);
}
