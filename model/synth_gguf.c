/* pp_synth_write_gguf: the synthetic model as one GGUF v3 file, with the metadata keys and tensor
 * names of llama.cpp's converters. Architecture "llama" (also for mistral, as the converters do,
 * with `llama.attention.sliding_window` added when set, and for mixtral, with the expert keys)
 * stores q/k rows permuted for the interleaved RoPE; "qwen2" and "qwen2moe" store them as HF does.
 * 1-D tensors are F32 whatever the dtype. Each expert role is one 3-D tensor
 * [n_experts, rows, cols] whose slices hold the values of the HF per-expert tensors. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "model/synth-impl.h"

static uint32_t file_type(enum pp_dtype t)
{
    switch (t) {
    case PP_DTYPE_F16:
        return 1; /* MOSTLY_F16 */
    case PP_DTYPE_Q8_0:
        return 7; /* MOSTLY_Q8_0 */
    case PP_DTYPE_BF16:
        return 32; /* MOSTLY_BF16 */
    default:
        return 0; /* ALL_F32 */
    }
}

static void add_model_keys(struct pp__gguf_writer *w, const struct pp__synth_model *m)
{
    const struct pp_synth_spec *s = &m->s;
    const char *a = m->arch == PP__SYNTH_QWEN2 ? "qwen2"
                    : m->arch == PP__SYNTH_QWEN2MOE ? "qwen2moe"
                                                    : "llama";
    char key[96], name[128];
#define KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", a, suffix), key)
    snprintf(name, sizeof(name), "ppserve synth %s d%d l%d %s seed %llu", s->arch, s->dim,
             s->n_layers, pp_dtype_name(s->dtype), (unsigned long long)s->seed);
    pp__gguf_add_str(w, "general.architecture", a);
    pp__gguf_add_str(w, "general.name", name);
    pp__gguf_add_u32(w, "general.alignment", PP__GGUF_ALIGN);
    pp__gguf_add_u32(w, "general.file_type", file_type(s->dtype));
    pp__gguf_add_u32(w, KEY("context_length"), (uint32_t)s->max_context);
    pp__gguf_add_u32(w, KEY("embedding_length"), (uint32_t)s->dim);
    pp__gguf_add_u32(w, KEY("block_count"), (uint32_t)s->n_layers);
    pp__gguf_add_u32(w, KEY("feed_forward_length"), (uint32_t)s->ffn_dim);
    pp__gguf_add_u32(w, KEY("attention.head_count"), (uint32_t)s->n_heads);
    pp__gguf_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_kv_heads);
    pp__gguf_add_u32(w, KEY("attention.key_length"), (uint32_t)s->head_dim);
    pp__gguf_add_u32(w, KEY("attention.value_length"), (uint32_t)s->head_dim);
    pp__gguf_add_f32(w, KEY("rope.freq_base"), s->rope_theta);
    pp__gguf_add_u32(w, KEY("rope.dimension_count"), (uint32_t)s->head_dim);
    pp__gguf_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), s->norm_eps);
    pp__gguf_add_u32(w, KEY("vocab_size"), (uint32_t)s->vocab_size);
    if (s->sliding_window)
        pp__gguf_add_u32(w, KEY("attention.sliding_window"), (uint32_t)s->sliding_window);
    if (m->moe) {
        pp__gguf_add_u32(w, KEY("expert_count"), (uint32_t)s->n_experts);
        pp__gguf_add_u32(w, KEY("expert_used_count"), (uint32_t)s->n_experts_used);
    }
    if (m->arch == PP__SYNTH_QWEN2MOE) {
        pp__gguf_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)s->expert_ffn_dim);
        pp__gguf_add_u32(w, KEY("expert_shared_feed_forward_length"),
                         (uint32_t)s->shared_ffn_dim);
        pp__gguf_add_bool(w, KEY("expert_weights_norm"), s->norm_topk_prob);
    }
#undef KEY
}

/* Byte-level BPE as llama.cpp's converter writes Llama 3: model gpt2, merges, pre llama-bpe. */
static void add_bpe_keys(struct pp__gguf_writer *w, const struct pp__synth_vocab *v)
{
    pp__gguf_add_str(w, "tokenizer.ggml.model", "gpt2");
    pp__gguf_add_str(w, "tokenizer.ggml.pre", "llama-bpe");
    pp__gguf_add_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                           (uint64_t)v->n);
    pp__gguf_add_i32_array(w, "tokenizer.ggml.token_type", v->types, (uint64_t)v->n);
    char **merges = pp_calloc(PP_MEM_MISC, (size_t)v->n_merges + 1, sizeof(char *));
    int ok = merges != NULL;
    for (int32_t k = 0; ok && k < v->n_merges; k++) {
        const char *a = v->tokens[v->merges[2 * k]], *b = v->tokens[v->merges[2 * k + 1]];
        size_t la = strlen(a), lb = strlen(b);
        if (!(merges[k] = pp_alloc(PP_MEM_MISC, la + lb + 2))) {
            ok = 0;
            break;
        }
        memcpy(merges[k], a, la);
        merges[k][la] = ' ';
        memcpy(merges[k] + la + 1, b, lb + 1);
    }
    if (ok)
        pp__gguf_add_str_array(w, "tokenizer.ggml.merges", (const char *const *)merges,
                               (uint64_t)v->n_merges);
    else
        w->kv.failed = 1; /* reported by pp__gguf_begin as out of memory */
    for (int32_t k = 0; merges && k < v->n_merges; k++)
        pp_free(PP_MEM_MISC, merges[k]);
    pp_free(PP_MEM_MISC, merges);
    pp__gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    pp__gguf_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    pp__gguf_add_bool(w, "tokenizer.ggml.add_bos_token", 1);
    pp__gguf_add_bool(w, "tokenizer.ggml.add_eos_token", 0);
}

static void add_tokenizer_keys(struct pp__gguf_writer *w, const struct pp__synth_vocab *v)
{
    if (v->byte_level) {
        add_bpe_keys(w, v);
        return;
    }
    pp__gguf_add_str(w, "tokenizer.ggml.model", "llama");
    pp__gguf_add_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                           (uint64_t)v->n);
    pp__gguf_add_f32_array(w, "tokenizer.ggml.scores", v->scores, (uint64_t)v->n);
    pp__gguf_add_i32_array(w, "tokenizer.ggml.token_type", v->types, (uint64_t)v->n);
    pp__gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    pp__gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    pp__gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    pp__gguf_add_bool(w, "tokenizer.ggml.add_bos_token", 1);
    pp__gguf_add_bool(w, "tokenizer.ggml.add_eos_token", 0);
}

static pp_status declare_tensors(struct pp__gguf_writer *w, const struct pp__synth_model *m)
{
    pp_status st;
    if (m->s.rope_llama3) {
        int64_t n = m->s.head_dim / 2;
        if ((st = pp__gguf_add_tensor(w, "rope_freqs.weight", 1, &n, PP_DTYPE_F32)))
            return st;
    }
    int64_t count = pp__synth_tensor_count(m);
    for (int64_t i = 0; i < count; i++) {
        struct pp__synth_tensor t;
        pp__synth_tensor_get(m, i, &t);
        enum pp_dtype store = pp__synth_store_type(m, &t, 1);
        if (t.expert > 0)
            continue; /* inside the 3-D tensor declared at expert 0 */
        if (t.expert == 0) {
            int64_t shape[3] = {t.n_experts, t.shape[0], t.shape[1]};
            st = pp__gguf_add_tensor(w, t.gguf_name, 3, shape, store);
        } else {
            st = pp__gguf_add_tensor(w, t.gguf_name, t.n_dims, t.shape, store);
        }
        if (st)
            return st;
    }
    return PP_OK;
}

static pp_status sink(void *ctx, const void *data, uint64_t n)
{
    return pp__gguf_write(ctx, data, n);
}

static pp_status write_tensors(struct pp__gguf_writer *w, const struct pp__synth_model *m)
{
    pp_status st;
    if (m->s.rope_llama3) {
        float *freqs = pp_alloc(PP_MEM_MISC, (size_t)m->s.head_dim / 2 * sizeof(float));
        if (!freqs)
            return pp_error(PP_ERR_NOMEM, "synth: no memory for rope_freqs");
        pp__synth_rope_freqs(m, freqs);
        st = pp__gguf_write(w, freqs, (uint64_t)m->s.head_dim / 2 * sizeof(float));
        pp_free(PP_MEM_MISC, freqs);
        if (st)
            return st;
    }
    int64_t count = pp__synth_tensor_count(m);
    for (int64_t i = 0; i < count; i++) {
        struct pp__synth_tensor t;
        pp__synth_tensor_get(m, i, &t);
        if (t.expert > 0)
            continue; /* written with expert 0: the experts of a role follow each other */
        if ((st = pp__synth_emit(m, &t, 1, sink, w)))
            return st;
        for (int32_t e = 1; t.expert == 0 && e < t.n_experts; e++) {
            struct pp__synth_tensor te;
            pp__synth_tensor_get(m, i + e, &te);
            if ((st = pp__synth_emit(m, &te, 1, sink, w)))
                return st;
        }
    }
    return PP_OK;
}

pp_status pp_synth_write_gguf(const struct pp_synth_spec *s, const char *path)
{
    struct pp__synth_model m;
    pp_status st = pp__synth_resolve(s, &m);
    if (st)
        return st;
    struct pp__synth_vocab v;
    if ((st = pp__synth_vocab_build_kind(m.s.tokenizer, m.s.vocab_size, &v)))
        return st;
    struct pp__gguf_writer w;
    pp__gguf_init(&w);
    add_model_keys(&w, &m);
    add_tokenizer_keys(&w, &v);
    pp__synth_vocab_free(&v);
    if (!(st = declare_tensors(&w, &m)) && !(st = pp__gguf_begin(&w, path)) &&
        !(st = write_tensors(&w, &m)))
        st = pp__gguf_finish(&w);
    pp__gguf_free(&w);
    return st;
}
