/* The last stage's sampling: a token history per sequence (prompt chunks and decode tokens, in the
 * order they were computed) and one sampled token per part that asks for it. It reproduces
 * model/generate.c bit for bit: the history passed to pp_sample holds the prompt and every token
 * generated before this one, and the RNG counter is the index of the token being generated. */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "pipeline/wire_sampling.h"
#include "stage/stage.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "SampledToken.logits are little-endian f32: copy them byte-swapped on this host"
#endif

#define HIST_BUCKETS 512 /* a power of two, above PP_STAGE_MAX_SEQS */

struct hist_entry {
    struct hist_entry *next;
    uint64_t id;
    int32_t *ids; /* [cap] */
    int32_t len;
    int32_t cap;
};

struct pp_stage_history {
    struct hist_entry *buckets[HIST_BUCKETS];
};

static size_t bucket_of(uint64_t id)
{
    id ^= id >> 33; /* ids are often small consecutive numbers: mix the bits a little */
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    return (size_t)(id & (HIST_BUCKETS - 1));
}

static struct hist_entry *find(const struct pp_stage_history *h, uint64_t id)
{
    for (struct hist_entry *e = h->buckets[bucket_of(id)]; e; e = e->next)
        if (e->id == id)
            return e;
    return NULL;
}

pp_status pp_stage_history_new(struct pp_stage_history **out)
{
    *out = pp_calloc(PP_MEM_MISC, 1, sizeof(**out));
    return *out ? PP_OK : pp_error(PP_ERR_NOMEM, "no memory for the token history");
}

static void entry_free(struct hist_entry *e)
{
    pp_free(PP_MEM_MISC, e->ids);
    pp_free(PP_MEM_MISC, e);
}

void pp_stage_history_free(struct pp_stage_history *h)
{
    if (!h)
        return;
    for (size_t b = 0; b < HIST_BUCKETS; b++)
        for (struct hist_entry *e = h->buckets[b], *n; e; e = n) {
            n = e->next;
            entry_free(e);
        }
    pp_free(PP_MEM_MISC, h);
}

int32_t pp_stage_history_len(const struct pp_stage_history *h, uint64_t id)
{
    const struct hist_entry *e = find(h, id);
    return e ? e->len : 0;
}

int pp_stage_history_release(struct pp_stage_history *h, uint64_t id)
{
    for (struct hist_entry **p = &h->buckets[bucket_of(id)]; *p; p = &(*p)->next)
        if ((*p)->id == id) {
            struct hist_entry *e = *p;
            *p = e->next;
            entry_free(e);
            return 1;
        }
    return 0;
}

/* The entry for id with room for `extra` more tokens, created when missing. */
static pp_status reserve(struct pp_stage_history *h, uint64_t id, int32_t extra)
{
    struct hist_entry *e = find(h, id);
    if (!e) {
        if (!(e = pp_calloc(PP_MEM_MISC, 1, sizeof(*e))))
            return pp_error(PP_ERR_NOMEM, "no memory for the history of sequence %llu",
                            (unsigned long long)id);
        e->id = id;
        size_t b = bucket_of(id);
        e->next = h->buckets[b];
        h->buckets[b] = e;
    }
    int64_t need = (int64_t)e->len + extra;
    if (need <= e->cap)
        return PP_OK;
    int64_t cap = e->cap ? e->cap : 64;
    while (cap < need)
        cap *= 2;
    if (cap > INT32_MAX)
        return pp_error(PP_ERR_OUT_OF_RANGE, "sequence %llu: %lld tokens of history",
                        (unsigned long long)id, (long long)need);
    int32_t *ids = pp_alloc(PP_MEM_MISC, (size_t)cap * sizeof(int32_t));
    if (!ids)
        return pp_error(PP_ERR_NOMEM, "no memory for %lld tokens of sequence %llu",
                        (long long)cap, (unsigned long long)id);
    if (e->len)
        memcpy(ids, e->ids, (size_t)e->len * sizeof(int32_t));
    pp_free(PP_MEM_MISC, e->ids);
    e->ids = ids;
    e->cap = (int32_t)cap;
    return PP_OK;
}

pp_status pp_stage_sample_prepare(struct pp_stage_history *h,
                                  const Ppserve__V1__MicrobatchHeader *hdr)
{
    for (size_t i = 0; i < hdr->n_parts; i++) {
        const Ppserve__V1__SeqPart *p = hdr->parts[i];
        if (p->want_logits) {
            struct pp_sampling sp;
            pp_status st = pp_sampling_from_wire(p->sampling, &sp);
            if (st != PP_OK)
                return pp_stage_error_wrap(st, "microbatch %llu, sequence %llu",
                                           (unsigned long long)hdr->microbatch_id,
                                           (unsigned long long)p->seq_id);
        }
        /* the history mirrors the KV cache: both grow only when a forward pass succeeds */
        int32_t have = pp_stage_history_len(h, p->seq_id);
        if (have != p->pos)
            return pp_error(PP_ERR_INVALID_ARG,
                            "sequence %llu: expected pos %d (tokens held), got %d",
                            (unsigned long long)p->seq_id, have, p->pos);
    }
    for (size_t i = 0; i < hdr->n_parts; i++) {
        pp_status st = reserve(h, hdr->parts[i]->seq_id, hdr->parts[i]->n_tokens);
        if (st != PP_OK)
            return st;
    }
    return PP_OK;
}

void pp_stage_sampled_free(struct pp_stage_sampled *o)
{
    pp_free(PP_MEM_MISC, o->tokens);
    pp_free(PP_MEM_MISC, o->ptrs);
    pp_free(PP_MEM_ACTIVATIONS, o->raw);
    memset(o, 0, sizeof(*o));
}

pp_status pp_stage_sample(struct pp_stage_history *h, struct pp_sampler *sampler, int32_t vocab,
                          const Ppserve__V1__MicrobatchHeader *hdr, float *logits,
                          struct pp_stage_sampled *out)
{
    memset(out, 0, sizeof(*out));
    size_t n_want = 0, n_raw = 0;
    for (size_t i = 0; i < hdr->n_parts; i++) {
        n_want += hdr->parts[i]->want_logits != 0;
        n_raw += hdr->parts[i]->want_logits && hdr->parts[i]->return_logits;
    }
    /* every part's tokens join its history first (pp_stage_sample_prepare made room) */
    for (size_t i = 0; i < hdr->n_parts; i++) {
        const Ppserve__V1__SeqPart *p = hdr->parts[i];
        struct hist_entry *e = find(h, p->seq_id);
        if (!e || e->len + (int64_t)p->n_token_ids > e->cap)
            return pp_error(PP_ERR_INTERNAL, "sequence %llu: history not prepared",
                            (unsigned long long)p->seq_id);
        memcpy(e->ids + e->len, p->token_ids, p->n_token_ids * sizeof(int32_t));
        e->len += (int32_t)p->n_token_ids;
    }
    out->tokens = pp_calloc(PP_MEM_MISC, n_want ? n_want : 1, sizeof(*out->tokens));
    out->ptrs = pp_calloc(PP_MEM_MISC, n_want ? n_want : 1, sizeof(*out->ptrs));
    out->raw = n_raw ? pp_alloc(PP_MEM_ACTIVATIONS, n_raw * (size_t)vocab * sizeof(float)) : NULL;
    if (!out->tokens || !out->ptrs || (n_raw && !out->raw)) {
        pp_stage_sampled_free(out);
        return pp_error(PP_ERR_NOMEM, "microbatch %llu: no memory for %zu sampled tokens",
                        (unsigned long long)hdr->microbatch_id, n_want);
    }
    size_t row = 0, raw_row = 0;
    for (size_t i = 0; i < hdr->n_parts; i++) {
        const Ppserve__V1__SeqPart *p = hdr->parts[i];
        if (!p->want_logits)
            continue;
        struct pp_sampling sp;
        pp_sampling_from_wire(p->sampling, &sp); /* validated by pp_stage_sample_prepare */
        float *l = logits + row * (size_t)vocab;
        Ppserve__V1__SampledToken *t = &out->tokens[row];
        ppserve__v1__sampled_token__init(t);
        t->seq_id = p->seq_id;
        if (p->return_logits) {
            /* little-endian f32 on the wire, as this host stores them (checked above) */
            float *r = out->raw + raw_row++ * (size_t)vocab;
            memcpy(r, l, (size_t)vocab * sizeof(float));
            t->logits.data = (uint8_t *)r;
            t->logits.len = (size_t)vocab * sizeof(float);
        }
        const struct hist_entry *e = find(h, p->seq_id);
        t->token = pp_sample(sampler, &sp, l, e->ids, e->len, p->step);
        out->ptrs[row] = t;
        row++;
    }
    out->n = n_want;
    return PP_OK;
}
