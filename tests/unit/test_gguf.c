/* Unit tests of model/gguf: a small GGUF file is written here by a writer independent of the
 * project's own (model/gguf_write.c), parsed, and then corrupted in every way a download or a bad
 * converter can: each prefix of it, bad magic and version, absurd counts, out-of-file offsets,
 * unknown types. Each must end in the right status and a message that says what was wrong, never in
 * a crash (the sanitizer build runs these too). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "model/gguf.h"

/* --- a minimal GGUF v3 writer
 * ---------------------------------------------------------------------- */

struct buf {
    uint8_t *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *v, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, v, n);
    b->len += n;
}

static void put_u32(struct buf *b, uint32_t v)
{
    put(b, &v, 4);
}

static void put_u64(struct buf *b, uint64_t v)
{
    put(b, &v, 8);
}

static void put_str(struct buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void pad_to(struct buf *b, size_t align)
{
    static const uint8_t zero[64];
    put(b, zero, (align - b->len % align) % align);
}

/* Where the interesting fields of the test file sit, so tests can corrupt one of them. */
struct layout {
    size_t version, n_tensors, n_kv;
    size_t arch_len;                  /* length of general.architecture's string value */
    size_t flag_type;                 /* the type field of test.flag */
    size_t tokens_elem_type;          /* element type of tokenizer.ggml.tokens */
    size_t ints_count;                /* element count of test.ints (i32) */
    size_t align_type, align_value;   /* general.alignment */
    size_t t_ndims[3], t_dim0[3], t_type[3], t_offset[3];
    size_t data_start;
};

#define ALIGN 64

/* Tensor data: t0 f32 [3, 8] at 0, t1 q8_0 [2, 32] at 128, t2 f16 [8] at 256. */
static const float t0_vals[24] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                  12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};

static void write_tensor_info(struct buf *b, struct layout *l, int i, const char *name,
                              uint32_t n_dims, const uint64_t *dims, uint32_t type, uint64_t off)
{
    put_str(b, name);
    l->t_ndims[i] = b->len;
    put_u32(b, n_dims);
    l->t_dim0[i] = b->len;
    for (uint32_t d = 0; d < n_dims; d++)
        put_u64(b, dims[d]); /* GGUF order: innermost (row length) first */
    l->t_type[i] = b->len;
    put_u32(b, type);
    l->t_offset[i] = b->len;
    put_u64(b, off);
}

/* The valid test file. It ends exactly where the last tensor's data ends, so every shorter prefix
 * is missing something. */
static struct buf build(struct layout *l)
{
    struct buf b = {0};
    put(&b, "GGUF", 4);
    l->version = b.len;
    put_u32(&b, 3);
    l->n_tensors = b.len;
    put_u64(&b, 3);
    l->n_kv = b.len;
    put_u64(&b, 10);

    put_str(&b, "general.architecture");
    put_u32(&b, PP_GGUF_STRING);
    l->arch_len = b.len;
    put_str(&b, "llama");

    put_str(&b, "llama.block_count");
    put_u32(&b, PP_GGUF_U32);
    put_u32(&b, 3);

    put_str(&b, "test.neg");
    put_u32(&b, PP_GGUF_I8);
    put(&b, "\xfb", 1); /* -5 */

    put_str(&b, "test.scale");
    put_u32(&b, PP_GGUF_F32);
    float scale = 1.5f;
    put(&b, &scale, 4);

    put_str(&b, "test.flag");
    l->flag_type = b.len;
    put_u32(&b, PP_GGUF_BOOL);
    put(&b, "\x01", 1);

    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, PP_GGUF_ARRAY);
    l->tokens_elem_type = b.len;
    put_u32(&b, PP_GGUF_STRING);
    put_u64(&b, 3);
    put_str(&b, "<s>");
    put_str(&b, "hello");
    put_str(&b, "");

    put_str(&b, "test.big");
    put_u32(&b, PP_GGUF_U64);
    put_u64(&b, ((uint64_t)1 << 63) + 5); /* does not fit an int64 */

    put_str(&b, "test.half");
    put_u32(&b, PP_GGUF_F64);
    double half = 0.25;
    put(&b, &half, 8);

    put_str(&b, "test.ints");
    put_u32(&b, PP_GGUF_ARRAY);
    put_u32(&b, PP_GGUF_I32);
    l->ints_count = b.len;
    put_u64(&b, 3);
    const int32_t ints[3] = {7, -8, 9};
    put(&b, ints, sizeof(ints));

    put_str(&b, "general.alignment");
    l->align_type = b.len;
    put_u32(&b, PP_GGUF_U32);
    l->align_value = b.len;
    put_u32(&b, ALIGN);

    const uint64_t d0[2] = {8, 3}, d1[2] = {32, 2}, d2[1] = {8};
    write_tensor_info(&b, l, 0, "tok_embd.weight", 2, d0, 0 /* F32 */, 0);
    write_tensor_info(&b, l, 1, "output.weight", 2, d1, 8 /* Q8_0 */, 128);
    write_tensor_info(&b, l, 2, "norm.weight", 1, d2, 1 /* F16 */, 256);
    pad_to(&b, ALIGN);
    l->data_start = b.len;

    put(&b, t0_vals, sizeof(t0_vals));
    pad_to(&b, ALIGN);
    for (int r = 0; r < 2; r++) {
        uint8_t blk[34];
        for (int i = 0; i < 34; i++)
            blk[i] = (uint8_t)(r * 50 + i);
        put(&b, blk, sizeof(blk));
    }
    pad_to(&b, ALIGN);
    for (int i = 0; i < 8; i++) {
        uint16_t h = pp_f32_to_f16((float)i);
        put(&b, &h, 2);
    }
    assert_int_equal(b.len, l->data_start + 272);
    return b;
}

static void patch_u32(struct buf *b, size_t at, uint32_t v)
{
    memcpy(b->p + at, &v, 4);
}

static void patch_u64(struct buf *b, size_t at, uint64_t v)
{
    memcpy(b->p + at, &v, 8);
}

/* --- fixture
 * ----------------------------------------------------------------------------------------- */

struct ctx {
    char *dir;
    char path[600];
    struct layout l;
    struct buf good;
};

static int setup(void **state)
{
    struct ctx *c = calloc(1, sizeof(*c));
    c->dir = pp_test_tmpdir();
    snprintf(c->path, sizeof(c->path), "%s/m.gguf", c->dir);
    c->good = build(&c->l);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    struct ctx *c = *state;
    pp_test_rmdir(c->dir);
    free(c->good.p);
    free(c);
    return 0;
}

/* Opens bytes written to the test path; returns the status (the parse is freed on success). */
static pp_status open_bytes(struct ctx *c, const void *p, size_t n)
{
    pp_test_write_file(c->path, p, n);
    struct pp_gguf *g = NULL;
    pp_error_clear();
    pp_status st = pp_gguf_open(c->path, &g);
    if (st == PP_OK)
        pp_gguf_free(g);
    return st;
}

/* A copy of the good file with one change must fail with st and a message naming the file and
 * containing word. */
static void expect_error(struct ctx *c, const struct buf *b, pp_status st, const char *word)
{
    pp_status got = open_bytes(c, b->p, b->len);
    if (got != st)
        fail_msg("expected %s, got %s (%s)", pp_strerror(st), pp_strerror(got), pp_error_detail());
    if (!strstr(pp_error_detail(), word) || !strstr(pp_error_detail(), c->path))
        fail_msg("message \"%s\" lacks \"%s\" or the path", pp_error_detail(), word);
}

static struct buf copy(const struct buf *b)
{
    struct buf d = {malloc(b->len), b->len, b->len};
    memcpy(d.p, b->p, b->len);
    return d;
}

static int str_is(struct pp_gguf_str s, const char *z)
{
    return s.len == strlen(z) && memcmp(s.ptr, z, s.len) == 0;
}

/* --- tests
 * --------------------------------------------------------------------------------------------- */

static void test_parse_valid(void **state)
{
    struct ctx *c = *state;
    pp_test_write_file(c->path, c->good.p, c->good.len);
    struct pp_gguf *g = NULL;
    assert_int_equal(pp_gguf_open(c->path, &g), PP_OK);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_kv, 10);
    assert_int_equal(g->n_tensors, 3);
    assert_int_equal(g->alignment, ALIGN);
    assert_int_equal(g->file.size, c->good.len);

    int64_t i64;
    float f;
    int flag;
    struct pp_gguf_str s;
    assert_int_equal(pp_gguf_get_i64(g, "llama.block_count", &i64), PP_OK);
    assert_int_equal(i64, 3);
    assert_int_equal(pp_gguf_get_i64(g, "test.neg", &i64), PP_OK);
    assert_int_equal(i64, -5); /* i8 is sign-extended */
    assert_int_equal(pp_gguf_get_f32(g, "test.scale", &f), PP_OK);
    assert_true(f == 1.5f);
    assert_int_equal(pp_gguf_get_f32(g, "test.half", &f), PP_OK); /* f64 narrows */
    assert_true(f == 0.25f);
    assert_int_equal(pp_gguf_get_f32(g, "llama.block_count", &f), PP_OK); /* integers convert */
    assert_true(f == 3.0f);
    assert_int_equal(pp_gguf_get_bool(g, "test.flag", &flag), PP_OK);
    assert_int_equal(flag, 1);
    assert_int_equal(pp_gguf_get_str(g, "general.architecture", &s), PP_OK);
    assert_true(str_is(s, "llama"));

    /* absent keys: NOT_FOUND; wrong types: FORMAT with a message naming the key */
    assert_int_equal(pp_gguf_get_i64(g, "no.such", &i64), PP_ERR_NOT_FOUND);
    assert_int_equal(pp_gguf_get_str(g, "no.such", &s), PP_ERR_NOT_FOUND);
    assert_null(pp_gguf_find(g, "no.such"));
    assert_null(pp_gguf_find(g, "general")); /* a prefix of a key is not the key */
    assert_int_equal(pp_gguf_get_i64(g, "test.big", &i64), PP_ERR_FORMAT);
    assert_non_null(strstr(pp_error_detail(), "test.big"));
    assert_int_equal(pp_gguf_get_i64(g, "general.architecture", &i64), PP_ERR_FORMAT);
    assert_non_null(strstr(pp_error_detail(), "integer"));
    assert_int_equal(pp_gguf_get_f32(g, "general.architecture", &f), PP_ERR_FORMAT);
    assert_non_null(strstr(pp_error_detail(), "number"));
    assert_int_equal(pp_gguf_get_bool(g, "llama.block_count", &flag), PP_ERR_FORMAT);
    assert_non_null(strstr(pp_error_detail(), "bool"));
    assert_int_equal(pp_gguf_get_str(g, "test.flag", &s), PP_ERR_FORMAT);
    assert_non_null(strstr(pp_error_detail(), "string"));

    /* arrays */
    const struct pp_gguf_kv *tok = pp_gguf_find(g, "tokenizer.ggml.tokens");
    assert_non_null(tok);
    assert_int_equal(tok->type, PP_GGUF_ARRAY);
    assert_int_equal(tok->arr_type, PP_GGUF_STRING);
    assert_int_equal(tok->arr_count, 3);
    struct pp_gguf_str strs[3];
    pp_gguf_arr_strings(tok, strs);
    assert_true(str_is(strs[0], "<s>"));
    assert_true(str_is(strs[1], "hello"));
    assert_true(str_is(strs[2], ""));
    const struct pp_gguf_kv *ints = pp_gguf_find(g, "test.ints");
    assert_int_equal(ints->arr_type, PP_GGUF_I32);
    assert_int_equal(ints->arr_count, 3);
    int32_t iv[3];
    memcpy(iv, ints->value, sizeof(iv));
    assert_true(iv[0] == 7 && iv[1] == -8 && iv[2] == 9);

    /* tensors: shapes reversed into numpy order, data in place at data_start + offset */
    const struct pp_tensor *t0 = pp_gguf_tensor(g, "tok_embd.weight");
    const struct pp_tensor *t1 = pp_gguf_tensor(g, "output.weight");
    const struct pp_tensor *t2 = pp_gguf_tensor(g, "norm.weight");
    assert_non_null(t0);
    assert_non_null(t1);
    assert_non_null(t2);
    assert_null(pp_gguf_tensor(g, "tok_embd"));
    assert_int_equal(t0->n_dims, 2);
    assert_int_equal(t0->shape[0], 3);
    assert_int_equal(t0->shape[1], 8);
    assert_int_equal(t0->dtype, PP_DTYPE_F32);
    assert_ptr_equal(t0->data, g->file.data + c->l.data_start);
    assert_int_equal(((const uint8_t *)t0->data - g->file.data) % ALIGN, 0);
    assert_memory_equal(t0->data, t0_vals, sizeof(t0_vals));
    assert_int_equal(t1->shape[0], 2);
    assert_int_equal(t1->shape[1], 32);
    assert_int_equal(t1->dtype, PP_DTYPE_Q8_0);
    assert_ptr_equal(t1->data, g->file.data + c->l.data_start + 128);
    assert_int_equal(((const uint8_t *)t1->data)[34], 50); /* row 1's first byte */
    assert_int_equal(t2->n_dims, 1);
    assert_int_equal(t2->shape[0], 8);
    assert_int_equal(t2->dtype, PP_DTYPE_F16);
    uint16_t h7;
    memcpy(&h7, (const uint8_t *)t2->data + 14, 2);
    assert_true(pp_f16_to_f32(h7) == 7.0f);
    pp_gguf_free(g);
    pp_gguf_free(NULL);
}

static void test_version_2_and_default_alignment(void **state)
{
    struct ctx *c = *state;
    struct buf b = copy(&c->good);
    patch_u32(&b, c->l.version, 2);
    assert_int_equal(open_bytes(c, b.p, b.len), PP_OK);
    /* renaming general.alignment leaves the default 32, to which offsets 0/128/256 conform; the
     * data start moves to the next multiple of 32 (it already is one of 64) */
    b.p[c->l.align_type - 1] = 'x'; /* the key's last byte: "general.alignmenx" */
    pp_test_write_file(c->path, b.p, b.len);
    struct pp_gguf *g = NULL;
    assert_int_equal(pp_gguf_open(c->path, &g), PP_OK);
    assert_int_equal(g->alignment, 32);
    assert_non_null(pp_gguf_find(g, "general.alignmenx"));
    pp_gguf_free(g);
    free(b.p);
}

/* Every prefix of the file is an error, a FORMAT one with a message, and never a crash or a
 * read past the end (ASan). */
static void test_every_truncation(void **state)
{
    struct ctx *c = *state;
    for (size_t n = 0; n < c->good.len; n++) {
        pp_status st = open_bytes(c, c->good.p, n);
        if (st != PP_ERR_FORMAT)
            fail_msg("prefix of %zu bytes: %s (%s)", n, pp_strerror(st), pp_error_detail());
        const char *d = pp_error_detail();
        if (!strstr(d, c->path) ||
            !(strstr(d, "truncated") || strstr(d, "too short") || strstr(d, "can hold")))
            fail_msg("prefix of %zu bytes: unhelpful message \"%s\"", n, d);
    }
    assert_int_equal(open_bytes(c, c->good.p, c->good.len), PP_OK);
}

static void test_bad_magic_and_version(void **state)
{
    struct ctx *c = *state;
    struct buf b = copy(&c->good);
    b.p[3] = 'X';
    expect_error(c, &b, PP_ERR_FORMAT, "magic");
    memcpy(b.p, "GGUF", 4);
    patch_u32(&b, c->l.version, 1);
    expect_error(c, &b, PP_ERR_UNSUPPORTED, "version");
    patch_u32(&b, c->l.version, 4);
    expect_error(c, &b, PP_ERR_UNSUPPORTED, "version");
    free(b.p);

    /* a safetensors file or random text given by mistake */
    const char text[] = "{\"not\": \"gguf\"} and some more text";
    pp_test_write_file(c->path, text, sizeof(text));
    struct pp_gguf *g = NULL;
    assert_int_equal(pp_gguf_open(c->path, &g), PP_ERR_FORMAT);
    assert_non_null(strstr(pp_error_detail(), "magic"));
}

/* Counts that no file of this size could hold are refused before anything is allocated for them. */
static void test_absurd_counts(void **state)
{
    struct ctx *c = *state;
    struct buf b = copy(&c->good);
    patch_u64(&b, c->l.n_tensors, (uint64_t)1 << 60);
    expect_error(c, &b, PP_ERR_FORMAT, "tensors");
    patch_u64(&b, c->l.n_tensors, 3);
    patch_u64(&b, c->l.n_kv, UINT64_MAX);
    expect_error(c, &b, PP_ERR_FORMAT, "metadata");
    patch_u64(&b, c->l.n_kv, 10);

    /* a string length far beyond the file */
    patch_u64(&b, c->l.arch_len, (uint64_t)1 << 62);
    expect_error(c, &b, PP_ERR_FORMAT, "truncated");
    patch_u64(&b, c->l.arch_len, UINT64_MAX);
    expect_error(c, &b, PP_ERR_FORMAT, "truncated");
    patch_u64(&b, c->l.arch_len, 5);

    /* an i32 array whose byte size overflows 64 bits, and one merely beyond the file */
    patch_u64(&b, c->l.ints_count, ((uint64_t)1 << 62) + 1);
    expect_error(c, &b, PP_ERR_FORMAT, "test.ints");
    patch_u64(&b, c->l.ints_count, 1000000);
    expect_error(c, &b, PP_ERR_FORMAT, "truncated");
    free(b.p);
}

static void test_bad_tensor_offsets(void **state)
{
    struct ctx *c = *state;
    struct buf b = copy(&c->good);
    patch_u64(&b, c->l.t_offset[1], 64 * 1000); /* aligned, far past the end */
    expect_error(c, &b, PP_ERR_FORMAT, "output.weight");
    expect_error(c, &b, PP_ERR_FORMAT, "data section");
    patch_u64(&b, c->l.t_offset[1], UINT64_MAX - 63); /* aligned; offset + size would wrap */
    expect_error(c, &b, PP_ERR_FORMAT, "data section");
    patch_u64(&b, c->l.t_offset[1], 256); /* starts inside the data, ends past it */
    expect_error(c, &b, PP_ERR_FORMAT, "data section");
    patch_u64(&b, c->l.t_offset[1], 100); /* not a multiple of the alignment */
    expect_error(c, &b, PP_ERR_FORMAT, "alignment");
    free(b.p);
}

static void test_bad_tensor_shapes(void **state)
{
    struct ctx *c = *state;
    struct buf b = copy(&c->good);
    patch_u32(&b, c->l.t_ndims[2], 0);
    expect_error(c, &b, PP_ERR_FORMAT, "dimensions");
    patch_u32(&b, c->l.t_ndims[2], 5);
    expect_error(c, &b, PP_ERR_FORMAT, "dimensions");
    free(b.p);

    b = copy(&c->good);
    patch_u64(&b, c->l.t_dim0[0], 0);
    expect_error(c, &b, PP_ERR_FORMAT, "dimension");
    patch_u64(&b, c->l.t_dim0[0], (uint64_t)1 << 41);
    expect_error(c, &b, PP_ERR_FORMAT, "dimension");
    free(b.p);

    /* Q8_0 rows are whole 32-value blocks */
    b = copy(&c->good);
    patch_u64(&b, c->l.t_dim0[1], 33);
    expect_error(c, &b, PP_ERR_FORMAT, "multiple of 32");
    free(b.p);
}

static void test_unknown_types(void **state)
{
    struct ctx *c = *state;
    struct buf b = copy(&c->good);
    patch_u32(&b, c->l.t_type[0], 2); /* Q4_0: a real ggml type we do not support */
    expect_error(c, &b, PP_ERR_UNSUPPORTED, "ggml type");
    patch_u32(&b, c->l.t_type[0], 1000);
    expect_error(c, &b, PP_ERR_UNSUPPORTED, "tok_embd.weight");
    free(b.p);

    b = copy(&c->good);
    patch_u32(&b, c->l.flag_type, 13); /* one past the last metadata type */
    expect_error(c, &b, PP_ERR_FORMAT, "unknown value type");
    patch_u32(&b, c->l.flag_type, UINT32_MAX);
    expect_error(c, &b, PP_ERR_FORMAT, "test.flag");
    free(b.p);

    b = copy(&c->good);
    patch_u32(&b, c->l.tokens_elem_type, PP_GGUF_ARRAY); /* arrays of arrays */
    expect_error(c, &b, PP_ERR_FORMAT, "nests");
    patch_u32(&b, c->l.tokens_elem_type, 77);
    expect_error(c, &b, PP_ERR_FORMAT, "unknown value type");
    free(b.p);
}

static void test_bad_alignment(void **state)
{
    struct ctx *c = *state;
    struct buf b = copy(&c->good);
    const uint32_t bad[] = {0, 48, 1u << 17};
    for (int i = 0; i < 3; i++) {
        patch_u32(&b, c->l.align_value, bad[i]);
        expect_error(c, &b, PP_ERR_FORMAT, "power of two");
    }
    /* general.alignment as a float: not an integer */
    patch_u32(&b, c->l.align_type, PP_GGUF_F32);
    expect_error(c, &b, PP_ERR_FORMAT, "general.alignment");
    free(b.p);
}

static void test_empty_and_missing_files(void **state)
{
    struct ctx *c = *state;
    assert_int_equal(open_bytes(c, "", 0), PP_ERR_FORMAT);
    assert_non_null(strstr(pp_error_detail(), "too short"));
    char missing[700];
    snprintf(missing, sizeof(missing), "%s/none.gguf", c->dir);
    struct pp_gguf *g = NULL;
    assert_int_equal(pp_gguf_open(missing, &g), PP_ERR_IO);
    assert_non_null(strstr(pp_error_detail(), "none.gguf"));
    assert_int_equal(pp_gguf_open(c->dir, &g), PP_ERR_IO); /* a directory */
}

/* Each allocation of pp_gguf_open may fail: NOMEM, nothing leaked, the file unmapped. */
static void test_alloc_failures(void **state)
{
    struct ctx *c = *state;
    pp_test_write_file(c->path, c->good.p, c->good.len);
    int64_t before = pp_mem_live(PP_MEM_MISC);
    int nth;
    for (nth = 1; nth < 20; nth++) {
        struct pp_gguf *g = NULL;
        pp_alloc_fail_at(nth);
        pp_status st = pp_gguf_open(c->path, &g);
        pp_alloc_fail_at(0);
        if (st == PP_OK) {
            pp_gguf_free(g);
            break;
        }
        assert_int_equal(st, PP_ERR_NOMEM);
        assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
    }
    assert_true(nth > 1 && nth < 20);
    assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_parse_valid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_2_and_default_alignment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_truncation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_magic_and_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_absurd_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_tensor_offsets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_tensor_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_types, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_alignment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_and_missing_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
