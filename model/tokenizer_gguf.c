/* The tokenizer of a GGUF file (tokenizer.ggml.*): `llama` (SentencePiece-style: tokens, scores,
 * token_type, the ▁ dummy prefix unless add_space_prefix is false) and `gpt2` (byte-level BPE:
 * tokens, token_type, merges, and the pre-tokenizer family in tokenizer.ggml.pre). */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "model/gguf.h"
#include "model/tokenizer-impl.h"

static int str_is(struct pp_gguf_str s, const char *c)
{
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static pp_status read_vocab(struct pp_tokenizer *t, const struct pp_gguf *g, const char *path)
{
    const struct pp_gguf_kv *toks = pp_gguf_find(g, "tokenizer.ggml.tokens");
    const struct pp_gguf_kv *scores = pp_gguf_find(g, "tokenizer.ggml.scores");
    const struct pp_gguf_kv *types = pp_gguf_find(g, "tokenizer.ggml.token_type");
    if (!toks || toks->type != PP_GGUF_ARRAY || toks->arr_type != PP_GGUF_STRING ||
        toks->arr_count == 0 || toks->arr_count > (1u << 24))
        return pp_error(PP_ERR_FORMAT,
                        "%s: tokenizer.ggml.tokens must be a non-empty string array "
                        "of at most 2^24 tokens",
                        path);
    int32_t n = (int32_t)toks->arr_count;
    if (scores && (scores->type != PP_GGUF_ARRAY || scores->arr_type != PP_GGUF_F32 ||
                   scores->arr_count != (uint64_t)n))
        return pp_error(PP_ERR_FORMAT, "%s: tokenizer.ggml.scores must hold %d f32 values", path,
                        n);
    if (types && (types->type != PP_GGUF_ARRAY || types->arr_type != PP_GGUF_I32 ||
                  types->arr_count != (uint64_t)n))
        return pp_error(PP_ERR_FORMAT, "%s: tokenizer.ggml.token_type must hold %d i32 values",
                        path, n);
    pp_status st = pp__tok_vocab_alloc(t, n);
    struct pp_gguf_str *strs = st ? NULL : pp_alloc(PP_MEM_MISC, (size_t)n * sizeof(*strs));
    if (st || !strs) {
        pp_free(PP_MEM_MISC, strs);
        return st ? st : pp_error(PP_ERR_NOMEM, "%s: no memory for %d tokens", path, n);
    }
    pp_gguf_arr_strings(toks, strs);
    for (int32_t i = 0; i < n && st == PP_OK; i++) {
        int32_t ty = PP__TT_NORMAL;
        if (types)
            memcpy(&ty, types->value + 4 * (size_t)i, 4);
        t->type[i] = ty >= PP__TT_NORMAL && ty <= PP__TT_BYTE ? (uint8_t)ty : PP__TT_NORMAL;
        if (scores)
            memcpy(&t->score[i], scores->value + 4 * (size_t)i, 4);
        if (strs[i].len > (1u << 20))
            st = pp_error(PP_ERR_FORMAT, "%s: token %d is %llu bytes long", path, i,
                          (unsigned long long)strs[i].len);
        else
            st = pp__tok_set_piece(t, i, strs[i].ptr, strs[i].len);
    }
    pp_free(PP_MEM_MISC, strs);
    return st;
}

static pp_status read_merges(struct pp_tokenizer *t, const struct pp_gguf *g, const char *path)
{
    const struct pp_gguf_kv *m = pp_gguf_find(g, "tokenizer.ggml.merges");
    if (!m || m->type != PP_GGUF_ARRAY || m->arr_type != PP_GGUF_STRING)
        return pp_error(PP_ERR_FORMAT,
                        "%s: a gpt2 tokenizer needs tokenizer.ggml.merges (a string "
                        "array of \"left right\")",
                        path);
    pp_status st = pp__tok_merges_alloc(t, (int64_t)m->arr_count);
    struct pp_gguf_str *strs =
        st ? NULL : pp_alloc(PP_MEM_MISC, ((size_t)m->arr_count + 1) * sizeof(*strs));
    if (st || !strs) {
        pp_free(PP_MEM_MISC, strs);
        return st ? st : pp_error(PP_ERR_NOMEM, "%s: no memory for the merges", path);
    }
    pp_gguf_arr_strings(m, strs);
    for (uint64_t r = 0; r < m->arr_count; r++) {
        /* the separator is the first space after the first byte (pieces hold no spaces in the
         * GPT-2 alphabet, but a left piece of " " itself must still split right) */
        const char *sp = strs[r].len > 1 ? memchr(strs[r].ptr + 1, ' ', strs[r].len - 1) : NULL;
        if (!sp)
            continue;
        size_t la = (size_t)(sp - strs[r].ptr);
        pp__tok_merge_add_str(t, strs[r].ptr, la, sp + 1, strs[r].len - la - 1, (int32_t)r);
    }
    pp_free(PP_MEM_MISC, strs);
    return PP_OK;
}

static pp_status read_specials(struct pp_tokenizer *t, const struct pp_gguf *g, int add_bos_default)
{
    int64_t v;
    if (pp_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &v) == PP_OK && v >= 0 && v < t->n)
        t->bos = (int32_t)v;
    if (pp_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &v) == PP_OK && v >= 0 && v < t->n)
        t->eos = (int32_t)v;
    if (pp_gguf_get_i64(g, "tokenizer.ggml.unknown_token_id", &v) == PP_OK && v >= 0 && v < t->n)
        t->unk = (int32_t)v;
    t->add_bos = add_bos_default;
    int b;
    if (pp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == PP_OK)
        t->add_bos = b;
    return PP_OK;
}

static pp_status add_norm(struct pp_tokenizer *t, enum pp__norm_kind k, const char *a,
                          const char *b)
{
    struct pp__norm_op *op = &t->norm[t->n_norm++];
    op->kind = k;
    op->a = pp_strdup(PP_MEM_MISC, a);
    op->b = b ? pp_strdup(PP_MEM_MISC, b) : NULL;
    if (!op->a || (b && !op->b))
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory");
    return PP_OK;
}

static pp_status load_llama(struct pp_tokenizer *t, const struct pp_gguf *g, const char *path)
{
    pp_status st = read_vocab(t, g, path);
    if (st)
        return st;
    t->kind = PP_TOKENIZER_SPM;
    t->merge_by_score = 1;
    t->byte_fallback = 1;
    t->meta_decode = 1;
    int prefix = 1;
    if (pp_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &prefix) != PP_OK)
        prefix = 1;
    t->strip_space = prefix;
    if (prefix && (st = add_norm(t, PP__NORM_PREPEND, PP__META, NULL)))
        return st;
    if ((st = add_norm(t, PP__NORM_REPLACE, " ", PP__META)))
        return st;
    return read_specials(t, g, 1);
}

static pp_status load_gpt2(struct pp_tokenizer *t, const struct pp_gguf *g, const char *path)
{
    struct pp_gguf_str pre = {"default", 7};
    (void)pp_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    char name[64];
    snprintf(name, sizeof(name), "%.*s", (int)(pre.len < 63 ? pre.len : 63), pre.ptr);
    const char *re = pp__tok_family_regex(name);
    if (!re)
        return pp_error(
            PP_ERR_UNSUPPORTED,
            "%s: pre-tokenizer family tokenizer.ggml.pre = \"%s\" "
            "is not supported (known: llama-bpe, llama3, llama-v3, qwen2, gpt2, default); use "
            "token ids",
            path, name);
    pp_status st;
    if ((st = read_vocab(t, g, path)) || (st = read_merges(t, g, path)))
        return st;
    t->kind = PP_TOKENIZER_BYTE_BPE;
    t->byte_level = 1;
    /* llama.cpp emits a whole piece that is a token for Llama 3, as its tokenizer.json says
     * (ignore_merges) */
    t->ignore_merges = strcmp(name, "llama-bpe") == 0 || strcmp(name, "llama3") == 0 ||
                       strcmp(name, "llama-v3") == 0;
    t->pre[0].kind = PP__PRE_SPLIT;
    t->n_pre = 1;
    if ((st = pp__tok_regex_compile(re, strlen(re), &t->pre[0].re)))
        return st;
    return read_specials(t, g, t->ignore_merges);
}

pp_status pp__tok_load_gguf(struct pp_tokenizer *t, const struct pp_gguf *g, const char *path)
{
    struct pp_gguf_str model;
    if (pp_gguf_get_str(g, "tokenizer.ggml.model", &model) != PP_OK)
        return pp_error(PP_ERR_NOT_FOUND,
                        "%s: no tokenizer (tokenizer.ggml.model absent); use "
                        "token ids",
                        path);
    if (str_is(model, "llama"))
        return load_llama(t, g, path);
    if (str_is(model, "gpt2"))
        return load_gpt2(t, g, path);
    return pp_error(PP_ERR_UNSUPPORTED,
                    "%s: tokenizer.ggml.model \"%.*s\" is not supported (only "
                    "llama and gpt2); use token ids",
                    path, (int)(model.len < 64 ? model.len : 64), model.ptr);
}
