/* Binding MoE layers (model/moe_bind.c): weight bytes count router, experts and shared expert;
 * misaligned experts are realigned and split GGUF experts (blk.N.ffn_gate.E.weight) bound, both
 * with the logits of the plain files; bad MoE files are refused with messages that say what was
 * expected and what arrived. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "model/executor.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth-impl.h"
#include "testutil.h"

#define VOCAB 300

static char *dir;
static char mix_gguf[600], qwen_hf[600];

/* The same models as test_moe_ffn.c's: a mixtral f16 GGUF and a qwen2moe f32 HF checkpoint. */
static int setup(void **state)
{
    (void)state;
    dir = pp_test_tmpdir();
    struct pp_synth_spec s;
    snprintf(mix_gguf, sizeof(mix_gguf), "%s/mix.gguf", dir);
    snprintf(qwen_hf, sizeof(qwen_hf), "%s/qwen_hf", dir);
    pp_test_moe_spec(&s, "mixtral", 6, 2);
    s.dtype = PP_DTYPE_F16;
    s.seed = 5;
    if (pp_synth_write_gguf(&s, mix_gguf) != PP_OK)
        return -1;
    pp_test_moe_spec(&s, "qwen2moe", 8, 3);
    s.expert_ffn_dim = 32;
    s.shared_ffn_dim = 64;
    s.seed = 9;
    return pp_synth_write_hf(&s, qwen_hf) == PP_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    pp_test_rmdir(dir);
    return 0;
}

static const int32_t prompt_a[] = {1, 17, 200, 45, 99, 3, 150};

/* Weight bytes count the router, every expert and the shared expert. */
static void test_weight_bytes(void **state)
{
    (void)state;
    struct pp_model *m;
    assert_int_equal(pp_model_open(qwen_hf, 1, 2, &m), PP_OK);
    const struct pp_moe_weights *mw = m->layers[0].moe;
    int64_t attn = (64 * 64 + 2 * 32 * 64 + 64 * 64) * 4;
    int64_t experts = 8 * (3 * 32 * 64) * 4, shared = 3 * 64 * 64 * 4, router = 8 * 64 * 4;
    assert_int_equal(pp_model_layer_bytes(m, 1), attn + experts + shared + router);
    assert_int_equal(pp_model_weight_bytes(m), attn + experts + shared + router);
    assert_non_null(mw->shared_gate_inp);
    assert_int_equal(mw->n_experts, 8);
    assert_int_equal(mw->expert_base, 0);
    pp_model_free(m);
}

/* ---- bad files ---- */

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc(*n + 1);
    assert_int_equal(fread(p, 1, *n, f), *n);
    p[*n] = 0;
    fclose(f);
    return p;
}

/* Copies src to dst with the first occurrence of `from` replaced by `to` (of any length). */
static void patch_copy(const char *src, const char *dst, const char *from, const char *to)
{
    size_t n;
    char *p = slurp(src, &n);
    char *at = memmem(p, n, from, strlen(from));
    assert_non_null(at);
    if (strlen(from) == strlen(to)) {
        memcpy(at, to, strlen(to));
        pp_test_write_file(dst, p, n);
    } else {
        size_t head = (size_t)(at - p), tail = n - head - strlen(from);
        char *q = malloc(n + strlen(to) + 1);
        memcpy(q, p, head);
        memcpy(q + head, to, strlen(to));
        memcpy(q + head + strlen(to), at + strlen(from), tail);
        pp_test_write_file(dst, q, head + strlen(to) + tail);
        free(q);
    }
    free(p);
}

/* A copy of the qwen HF checkpoint in `name` with config.json or the weights patched. */
static void hf_variant(const char *name, const char *file, const char *from, const char *to,
                       char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", dir, name);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", out, qwen_hf, out);
    assert_int_equal(system(cmd), 0);
    char src[1024], dst[1024];
    snprintf(src, sizeof(src), "%s/%s", qwen_hf, file);
    snprintf(dst, sizeof(dst), "%s/%s", out, file);
    patch_copy(src, dst, from, to);
}

static void expect_refused(const char *path, pp_status want, const char *part1, const char *part2)
{
    struct pp_model *m = NULL;
    pp_status st = pp_model_open(path, 0, -1, &m);
    if (st != want || !strstr(pp_error_detail(), part1) || !strstr(pp_error_detail(), part2))
        fail_msg("%s: got status %d, message \"%s\"; expected %d with \"%s\" and \"%s\"", path, st,
                 pp_error_detail(), want, part1, part2);
    assert_null(m);
}

static void test_bad_files_refused(void **state)
{
    (void)state;
    char p[700];
    hf_variant("k9", "config.json", "\"num_experts_per_tok\": 3", "\"num_experts_per_tok\": 9", p,
               sizeof(p));
    expect_refused(p, PP_ERR_FORMAT, "experts used per token is 9", "1..8");
    hf_variant("sparse2", "config.json", "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2",
               p, sizeof(p));
    expect_refused(p, PP_ERR_UNSUPPORTED, "decoder_sparse_step", "only 1");
    hf_variant("dense_layers", "config.json", "\"mlp_only_layers\": []", "\"mlp_only_layers\": [1]",
               p, sizeof(p));
    expect_refused(p, PP_ERR_UNSUPPORTED, "mlp_only_layers", "non-empty");
    hf_variant("no_experts", "config.json", "\"num_experts\": 8,", "", p, sizeof(p));
    expect_refused(p, PP_ERR_FORMAT, "config.json", "\"num_experts\"");
    hf_variant("wide", "config.json", "\"moe_intermediate_size\": 32",
               "\"moe_intermediate_size\": 48", p, sizeof(p));
    expect_refused(p, PP_ERR_FORMAT, "blk.0.ffn_gate.0.weight",
                   "expected shape [48, 64], got [32, 64]");
    hf_variant("missing", "model.safetensors", "experts.7.up_proj", "experts.7.up_prox", p,
               sizeof(p));
    expect_refused(p, PP_ERR_NOT_FOUND, "missing tensor blk.0.ffn_up.7.weight", "found 7");
    /* GGUF: a 3-D tensor renamed away, and expert_used_count above expert_count */
    char g[700];
    snprintf(g, sizeof(g), "%s/no_down.gguf", dir);
    patch_copy(mix_gguf, g, "blk.1.ffn_down_exps", "blk.1.ffn_down_expz");
    expect_refused(g, PP_ERR_NOT_FOUND, "missing tensor blk.1.ffn_down_exps.weight",
                   "blk.1.ffn_down.0.weight");
    snprintf(g, sizeof(g), "%s/k7.gguf", dir);
    /* the key, its type (u32 = 4) and the value 2, little-endian */
    static const char key[] = "llama.expert_used_count\x04\0\0\0\x02\0\0\0";
    static const char bad[] = "llama.expert_used_count\x04\0\0\0\x07\0\0\0";
    size_t n;
    char *buf = slurp(mix_gguf, &n);
    char *at = memmem(buf, n, key, sizeof(key) - 1);
    assert_non_null(at);
    memcpy(at, bad, sizeof(bad) - 1);
    pp_test_write_file(g, buf, n);
    free(buf);
    expect_refused(g, PP_ERR_FORMAT, "experts used per token is 7", "1..6");
}

/* The qwen HF checkpoint with its tensor data moved 2 bytes on: every f32 matrix misaligned. */
static void write_misaligned(const char *out)
{
    char cmd[2048], path[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", out, qwen_hf, out);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof(path), "%s/model.safetensors", qwen_hf);
    size_t n;
    char *in = slurp(path, &n);
    uint64_t hlen;
    memcpy(&hlen, in, 8);
    char *hdr = malloc(hlen * 2 + 64), *w = hdr;
    const char *key = "\"data_offsets\":[";
    for (const char *r = in + 8; r < in + 8 + hlen;) {
        const char *at = strstr(r, key);
        if (!at || at >= in + 8 + hlen) {
            memcpy(w, r, (size_t)(in + 8 + hlen - r));
            w += in + 8 + hlen - r;
            break;
        }
        memcpy(w, r, (size_t)(at - r) + strlen(key));
        w += at - r + (ptrdiff_t)strlen(key);
        unsigned long long b, e;
        int used = 0;
        assert_int_equal(sscanf(at + strlen(key), "%llu,%llu%n", &b, &e, &used), 2);
        w += sprintf(w, "%llu,%llu", b + 2, e + 2);
        r = at + strlen(key) + used;
    }
    while ((w - hdr) % 8)
        *w++ = ' ';
    uint64_t new_len = (uint64_t)(w - hdr);
    size_t total = 8 + new_len + 2 + (n - 8 - hlen);
    char *outbuf = calloc(1, total);
    memcpy(outbuf, &new_len, 8);
    memcpy(outbuf + 8, hdr, new_len);
    memcpy(outbuf + 8 + new_len + 2, in + 8 + hlen, n - 8 - hlen);
    snprintf(path, sizeof(path), "%s/model.safetensors", out);
    pp_test_write_file(path, outbuf, total);
    free(outbuf);
    free(hdr);
    free(in);
}

/* Misaligned experts are realigned into owned copies (the list grows as needed), same logits. */
static void test_misaligned_experts_realigned(void **state)
{
    (void)state;
    char path[700];
    snprintf(path, sizeof(path), "%s/misaligned", dir);
    write_misaligned(path);
    float a[VOCAB], b[VOCAB];
    struct pp_test_engine e, f;
    pp_test_engine_open(&e, qwen_hf, 0, -1, 1, 0, 2, 256);
    pp_test_engine_open(&f, path, 0, -1, 1, 0, 2, 256);
    assert_int_equal(e.m->n_owned, 0);
    /* per layer: 4 attention + router + 8 experts × 3 + 3 shared; embedding, head */
    assert_int_equal(f.m->n_owned, 3 * (4 + 1 + 24 + 3) + 2);
    struct pp_exec_seq p = {1, 0, 7, 1};
    struct pp_exec_batch bt = {1, &p, prompt_a, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &bt, NULL, a), PP_OK);
    assert_int_equal(pp_executor_forward(f.ex, &bt, NULL, b), PP_OK);
    assert_memory_equal(a, b, sizeof(a));
    pp_test_engine_close(&e);
    pp_test_engine_close(&f);
}

/* The mixtral GGUF rewritten as older converters split it: blk.N.ffn_gate.E.weight per expert
 * instead of the 3-D blk.N.ffn_gate_exps.weight (model keys only; no tokenizer needed here). */
static void write_split_gguf(const char *out)
{
    struct pp_model_config c;
    assert_int_equal(pp_model_read_config(mix_gguf, &c), PP_OK);
    struct pp_gguf *g;
    assert_int_equal(pp_gguf_open(mix_gguf, &g), PP_OK);
    struct pp__gguf_writer w;
    pp__gguf_init(&w);
    pp__gguf_add_str(&w, "general.architecture", "llama");
    pp__gguf_add_u32(&w, "llama.embedding_length", (uint32_t)c.dim);
    pp__gguf_add_u32(&w, "llama.block_count", (uint32_t)c.n_layers);
    pp__gguf_add_u32(&w, "llama.feed_forward_length", (uint32_t)c.ffn_dim);
    pp__gguf_add_u32(&w, "llama.attention.head_count", (uint32_t)c.n_heads);
    pp__gguf_add_u32(&w, "llama.attention.head_count_kv", (uint32_t)c.n_kv_heads);
    pp__gguf_add_u32(&w, "llama.context_length", (uint32_t)c.max_context);
    pp__gguf_add_f32(&w, "llama.attention.layer_norm_rms_epsilon", c.norm_eps);
    pp__gguf_add_f32(&w, "llama.rope.freq_base", c.rope_theta);
    pp__gguf_add_u32(&w, "llama.expert_count", (uint32_t)c.n_experts);
    pp__gguf_add_u32(&w, "llama.expert_used_count", (uint32_t)c.n_experts_used);
    char name[128];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            assert_int_equal(pp__gguf_begin(&w, out), PP_OK);
        for (int64_t i = 0; i < g->n_tensors; i++) {
            const struct pp_gguf_tensor_info *ti = &g->tensors[i];
            const struct pp_tensor *t = &ti->t;
            const char *exps = memmem(ti->name.ptr, ti->name.len, "_exps.", 6);
            int64_t n = exps ? t->shape[0] : 1, cols = t->shape[t->n_dims - 1];
            int64_t rows = pp_tensor_elems(t) / cols / n;
            int64_t bytes = rows * pp_dtype_row_bytes(t->dtype, cols);
            for (int64_t e = 0; e < n; e++) {
                if (exps)
                    snprintf(name, sizeof(name), "%.*s.%lld.weight",
                             (int)(exps - ti->name.ptr), ti->name.ptr, (long long)e);
                else
                    snprintf(name, sizeof(name), "%.*s", (int)ti->name.len, ti->name.ptr);
                int64_t shape[2] = {rows, cols};
                if (pass == 0)
                    assert_int_equal(pp__gguf_add_tensor(&w, name, exps ? 2 : t->n_dims,
                                                         exps ? shape : t->shape, t->dtype),
                                     PP_OK);
                else
                    assert_int_equal(pp__gguf_write(&w, (const uint8_t *)t->data + e * bytes,
                                                    (uint64_t)bytes),
                                     PP_OK);
            }
        }
    }
    assert_int_equal(pp__gguf_finish(&w), PP_OK);
    pp__gguf_free(&w);
    pp_gguf_free(g);
}

/* Split GGUF files bind their per-expert tensors and compute the same logits as 3-D ones. */
static void test_split_gguf_experts(void **state)
{
    (void)state;
    char path[700];
    snprintf(path, sizeof(path), "%s/split.gguf", dir);
    write_split_gguf(path);
    float a[VOCAB], b[VOCAB];
    struct pp_test_engine e, f;
    pp_test_engine_open(&e, mix_gguf, 0, -1, 1, 0, 2, 256);
    pp_test_engine_open(&f, path, 0, -1, 1, 0, 2, 256);
    assert_ptr_not_equal(f.m->layers[2].moe->down[5].data, NULL);
    struct pp_exec_seq p = {1, 0, 7, 1};
    struct pp_exec_batch bt = {1, &p, prompt_a, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &bt, NULL, a), PP_OK);
    assert_int_equal(pp_executor_forward(f.ex, &bt, NULL, b), PP_OK);
    assert_memory_equal(a, b, sizeof(a));
    pp_test_engine_close(&e);
    pp_test_engine_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_bytes),
        cmocka_unit_test(test_bad_files_refused),
        cmocka_unit_test(test_misaligned_experts_realigned),
        cmocka_unit_test(test_split_gguf_experts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
