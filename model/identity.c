/* The model fingerprint. Each tensor gets its own digest; the digests are added lane by lane, so
 * the result does not depend on the order tensors are listed or split into shards. */
#include "model/identity.h"

#include <stdio.h>
#include <string.h>

#include "common/hash.h"
#include "model/source.h"

#define WINDOW 64

struct acc {
    uint64_t sum[2];
    int64_t count;
};

static void visit(void *ud, const char *name, size_t name_len, const struct pp_tensor *t)
{
    struct acc *acc = ud;
    struct pp_hash h;
    pp_hash_init(&h, 0x7070736572766531ull);
    pp_hash_bytes(&h, name, name_len);
    pp_hash_word(&h, (uint64_t)t->dtype);
    pp_hash_word(&h, (uint64_t)t->n_dims);
    for (int32_t i = 0; i < t->n_dims; i++)
        pp_hash_word(&h, (uint64_t)t->shape[i]);
    int64_t cols = t->n_dims > 0 ? t->shape[t->n_dims - 1] : 1;
    int64_t row_bytes = pp_dtype_row_bytes(t->dtype, cols);
    int64_t bytes = row_bytes > 0 && cols > 0 ? pp_tensor_elems(t) / cols * row_bytes : 0;
    if (t->data && bytes > 0) {
        const unsigned char *d = t->data;
        for (int k = 0; k < 4; k++) {
            int64_t off = bytes * k / 3;
            if (off > bytes - WINDOW)
                off = bytes > WINDOW ? bytes - WINDOW : 0;
            pp_hash_bytes(&h, d + off, (size_t)(bytes < WINDOW ? bytes : WINDOW));
        }
    }
    uint64_t dg[2];
    pp_hash_final(&h, dg);
    acc->sum[0] += dg[0];
    acc->sum[1] += dg[1];
    acc->count++;
}

pp_status pp_model_identity(const char *path, char out[PP_MODEL_ID_LEN])
{
    struct pp_source *s;
    pp_status st = pp__source_open(path, &s);
    if (st != PP_OK)
        return st;
    struct acc acc = {{0, 0}, 0};
    st = pp__source_for_each_tensor(s, visit, &acc);
    if (st == PP_OK) {
        const struct pp_model_config *c = &s->cfg;
        struct pp_hash h;
        pp_hash_init(&h, 0x6964656e74697479ull);
        int64_t fields[] = {c->arch, c->format, c->dim, c->n_layers, c->n_heads, c->n_kv_heads,
                            c->head_dim, c->ffn_dim, c->vocab_size, c->max_context,
                            c->sliding_window, c->rope_layout, c->tied_embeddings,
                            c->rope_scaling.llama3, c->rope_scaling.original_context};
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            pp_hash_word(&h, (uint64_t)fields[i]);
        /* MoE fields only for MoE models, so dense identities stay what they were */
        int64_t moe[] = {c->n_experts, c->n_experts_used, c->expert_ffn_dim, c->shared_ffn_dim,
                         c->norm_topk_prob, c->moe_gating};
        for (size_t i = 0; c->n_experts > 0 && i < sizeof(moe) / sizeof(moe[0]); i++)
            pp_hash_word(&h, (uint64_t)moe[i]);
        float floats[] = {c->norm_eps, c->rope_theta, c->rope_scaling.factor,
                          c->rope_scaling.low_freq_factor, c->rope_scaling.high_freq_factor};
        pp_hash_bytes(&h, floats, sizeof(floats));
        pp_hash_word(&h, acc.sum[0]);
        pp_hash_word(&h, acc.sum[1]);
        pp_hash_word(&h, (uint64_t)acc.count);
        uint64_t id[2];
        pp_hash_final(&h, id);
        snprintf(out, PP_MODEL_ID_LEN, "ppid1-%016llx%016llx", (unsigned long long)id[0],
                 (unsigned long long)id[1]);
    }
    pp__source_free(s);
    return st;
}
