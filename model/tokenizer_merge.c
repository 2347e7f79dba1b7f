/* BPE on one pre-tokenized piece: the piece starts as one symbol per character (byte-level: per
 * byte, in the GPT-2 alphabet) in a doubly linked list, and a binary heap holds every adjacent pair
 * that could merge, keyed by (priority, position). Popping the best pair, checking it is still
 * current, merging, and pushing the two new neighbour pairs costs O(log n) per merge, so a piece
 * of n characters encodes in O(n log n).
 *
 * Priority: SentencePiece (merge_by_score) merges the pair whose concatenation is a token with the
 * highest score; rank-based BPE merges the pair with the lowest merge rank. Ties: leftmost.
 * A heap entry remembers the combined length of its two symbols; symbols only ever grow, so the
 * entry is current exactly when both are alive, adjacent and that length is unchanged. */
#include <string.h>

#include "common/utf8.h"
#include "common/alloc.h"
#include "model/tokenizer-impl.h"

struct pp__merge_sym {
    int32_t start, len; /* bytes of the (mapped) piece; len 0: merged away */
    int32_t prev, next; /* -1 at the ends */
    int32_t id;         /* token id, -1 when the symbol is not a token */
};

struct pp__merge_cand {
    float prio;   /* lower is better */
    int32_t left; /* symbol index (= position order) */
    int32_t size; /* len(left) + len(right) when pushed */
    int32_t result;
};

void pp__merge_scratch_free(struct pp__merge_scratch *s)
{
    pp_free(PP_MEM_MISC, s->sym);
    pp_free(PP_MEM_MISC, s->heap);
    pp_free(PP_MEM_MISC, s->mapped);
    memset(s, 0, sizeof(*s));
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (*cap >= need)
        return 1;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = pp_alloc(PP_MEM_MISC, c * elem);
    if (!q)
        return 0;
    pp_free(PP_MEM_MISC, *p);
    *p = q;
    *cap = c;
    return 1;
}

static int better(const struct pp__merge_cand *a, const struct pp__merge_cand *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

struct heap {
    struct pp__merge_cand *v;
    size_t n;
};

static void heap_push(struct heap *h, struct pp__merge_cand c)
{
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!better(&c, &h->v[p]))
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
}

static struct pp__merge_cand heap_pop(struct heap *h)
{
    struct pp__merge_cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct pp__merge_cand *best = &last;
        if (l < h->n && better(&h->v[l], best)) {
            m = l;
            best = &h->v[l];
        }
        if (r < h->n && better(&h->v[r], best))
            m = r;
        if (m == i)
            break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n > 0)
        h->v[i] = last;
    return top;
}

/* Pushes the pair (a, a.next) when it can merge. */
static void try_pair(const struct pp_tokenizer *t, const char *text, struct pp__merge_sym *sym,
                     int32_t a, struct heap *h)
{
    if (a < 0 || sym[a].next < 0)
        return;
    int32_t b = sym[a].next;
    struct pp__merge_cand c = {0, a, sym[a].len + sym[b].len, -1};
    if (t->merge_by_score) {
        int32_t id = pp__tok_lookup(t, text + sym[a].start, (size_t)c.size);
        if (id < 0)
            return;
        c.prio = -t->score[id];
        c.result = id;
    } else {
        if (sym[a].id < 0 || sym[b].id < 0)
            return;
        const struct pp__merge_slot *m = pp__tok_merge_find(t, sym[a].id, sym[b].id);
        if (!m)
            return;
        c.prio = (float)m->rank;
        c.result = m->result;
    }
    heap_push(h, c);
}

static void put_id(struct pp_buf *out, int32_t id)
{
    pp_buf_put(out, &id, sizeof(id));
}

/* A symbol that is no token: its bytes as <0xXX> tokens, else the unknown token (once). */
static void put_fallback(const struct pp_tokenizer *t, const unsigned char *p, size_t n,
                         struct pp_buf *out)
{
    if (t->byte_fallback && !t->byte_level) {
        int all = 1;
        for (size_t i = 0; i < n; i++)
            all &= t->byte_id[p[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < n; i++)
                put_id(out, t->byte_id[p[i]]);
            return;
        }
    }
    if (t->unk >= 0)
        put_id(out, t->unk);
}

pp_status pp__tok_encode_piece(const struct pp_tokenizer *t, const char *p, size_t n,
                               struct pp__merge_scratch *s, struct pp_buf *out)
{
    if (n == 0)
        return PP_OK;
    const char *text = p;
    size_t tn = n;
    if (t->byte_level) {
        if (!grow((void **)&s->mapped, &s->mapped_cap, 2 * n, 1))
            return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for a piece of %zu bytes", n);
        tn = 0;
        for (size_t i = 0; i < n; i++)
            tn += pp__tok_byte_to_char((uint8_t)p[i], s->mapped + tn);
        text = s->mapped;
    }
    if (t->ignore_merges) {
        int32_t id = pp__tok_lookup(t, text, tn);
        if (id >= 0) {
            put_id(out, id);
            return PP_OK;
        }
    }
    if (!grow((void **)&s->sym, &s->sym_cap, tn, sizeof(*s->sym)) ||
        !grow((void **)&s->heap, &s->heap_cap, 3 * tn + 2, sizeof(*s->heap)))
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for a piece of %zu bytes", n);
    struct pp__merge_sym *sym = s->sym;
    int32_t ns = 0;
    for (size_t i = 0; i < tn;) {
        size_t cl = pp_utf8_step((const unsigned char *)text + i, tn - i);
        sym[ns] = (struct pp__merge_sym){(int32_t)i, (int32_t)cl, ns - 1, ns + 1,
                                         pp__tok_lookup(t, text + i, cl)};
        ns++;
        i += cl;
    }
    sym[ns - 1].next = -1;
    struct heap h = {s->heap, 0};
    for (int32_t i = 0; i + 1 < ns; i++)
        try_pair(t, text, sym, i, &h);
    while (h.n > 0) {
        struct pp__merge_cand c = heap_pop(&h);
        struct pp__merge_sym *a = &sym[c.left];
        if (a->len == 0 || a->next < 0 || a->len + sym[a->next].len != c.size)
            continue; /* stale: one side changed since this pair was pushed */
        struct pp__merge_sym *b = &sym[a->next];
        a->len += b->len;
        a->id = c.result;
        a->next = b->next;
        if (b->next >= 0)
            sym[b->next].prev = c.left;
        b->len = 0;
        try_pair(t, text, sym, a->prev, &h);
        try_pair(t, text, sym, c.left, &h);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0)
            put_id(out, sym[i].id);
        else
            put_fallback(t, (const unsigned char *)text + sym[i].start, (size_t)sym[i].len, out);
    }
    return out->failed ? pp_error(PP_ERR_NOMEM, "tokenizer: no memory for the ids") : PP_OK;
}
