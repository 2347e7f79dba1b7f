/* The tokenizer's tables: pieces with an open-addressing hash from piece to id, the merge table
 * keyed by (left id, right id), and the index of special tokens matched in raw text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "model/tokenizer-impl.h"

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

pp_status pp__tok_vocab_alloc(struct pp_tokenizer *t, int32_t n)
{
    t->n = n;
    t->piece = pp_calloc(PP_MEM_MISC, (size_t)n, sizeof(char *));
    t->len = pp_calloc(PP_MEM_MISC, (size_t)n, sizeof(int32_t));
    t->score = pp_calloc(PP_MEM_MISC, (size_t)n, sizeof(float));
    t->type = pp_calloc(PP_MEM_MISC, (size_t)n, 1);
    t->hash_cap = 16;
    while (t->hash_cap < 2 * (int64_t)n)
        t->hash_cap <<= 1;
    t->hash = pp_alloc(PP_MEM_MISC, (size_t)t->hash_cap * sizeof(int32_t));
    if (!t->piece || !t->len || !t->score || !t->type || !t->hash)
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for %d tokens", n);
    memset(t->hash, 0xff, (size_t)t->hash_cap * sizeof(int32_t));
    return PP_OK;
}

int32_t pp__tok_lookup(const struct pp_tokenizer *t, const char *s, size_t n)
{
    uint64_t mask = (uint64_t)t->hash_cap - 1;
    for (uint64_t h = hash_bytes(s, n) & mask;; h = (h + 1) & mask) {
        int32_t id = t->hash[h];
        if (id < 0)
            return -1;
        if ((size_t)t->len[id] == n && memcmp(t->piece[id], s, n) == 0)
            return id;
    }
}

static int parse_byte_piece(const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    const char *hi = memchr(hex, s[3], 16), *lo = memchr(hex, s[4], 16);
    if (!hi || !lo || !s[3] || !s[4])
        return -1;
    return (int)((hi - hex) * 16 + (lo - hex));
}

pp_status pp__tok_set_piece(struct pp_tokenizer *t, int32_t id, const char *s, size_t n)
{
    if (t->piece[id])
        return PP_OK; /* an id given twice (vocab and added_tokens): the first wins */
    if (!(t->piece[id] = pp_strndup(PP_MEM_MISC, s, n)))
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for token %d", id);
    t->len[id] = (int32_t)n;
    int byte = parse_byte_piece(s, n);
    if (byte >= 0 &&
        (t->type[id] == 0 || t->type[id] == PP__TT_NORMAL || t->type[id] == PP__TT_BYTE)) {
        t->type[id] = PP__TT_BYTE;
        if (t->byte_id[byte] < 0)
            t->byte_id[byte] = id;
    }
    if (n == 0 || pp__tok_lookup(t, s, n) >= 0)
        return PP_OK; /* empty or duplicate piece: the first id keeps the lookup */
    uint64_t mask = (uint64_t)t->hash_cap - 1;
    uint64_t h = hash_bytes(s, n) & mask;
    while (t->hash[h] >= 0)
        h = (h + 1) & mask;
    t->hash[h] = id;
    return PP_OK;
}

pp_status pp__tok_fill_missing(struct pp_tokenizer *t)
{
    for (int32_t i = 0; i < t->n; i++) {
        if (t->piece[i])
            continue;
        if (!(t->piece[i] = pp_strndup(PP_MEM_MISC, "", 0)))
            return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for token %d", i);
        if (t->type[i] == 0)
            t->type[i] = PP__TT_UNUSED;
    }
    return PP_OK;
}

static uint64_t hash_pair(int32_t a, int32_t b)
{
    uint64_t x = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

pp_status pp__tok_merges_alloc(struct pp_tokenizer *t, int64_t n)
{
    t->merge_cap = 16;
    while (t->merge_cap < 2 * n)
        t->merge_cap <<= 1;
    t->merges = pp_alloc(PP_MEM_MISC, (size_t)t->merge_cap * sizeof(*t->merges));
    if (!t->merges)
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for %lld merges", (long long)n);
    for (int64_t i = 0; i < t->merge_cap; i++)
        t->merges[i].left = -1;
    t->n_merges = 0;
    return PP_OK;
}

const struct pp__merge_slot *pp__tok_merge_find(const struct pp_tokenizer *t, int32_t left,
                                                int32_t right)
{
    if (!t->merges)
        return NULL;
    uint64_t mask = (uint64_t)t->merge_cap - 1;
    for (uint64_t h = hash_pair(left, right) & mask;; h = (h + 1) & mask) {
        const struct pp__merge_slot *m = &t->merges[h];
        if (m->left < 0)
            return NULL;
        if (m->left == left && m->right == right)
            return m;
    }
}

void pp__tok_merge_add(struct pp_tokenizer *t, int32_t left, int32_t right, int32_t rank,
                       int32_t result)
{
    if (t->n_merges * 2 >= t->merge_cap || pp__tok_merge_find(t, left, right))
        return; /* table full (cannot happen when sized by the loader) or a repeated merge */
    uint64_t mask = (uint64_t)t->merge_cap - 1;
    uint64_t h = hash_pair(left, right) & mask;
    while (t->merges[h].left >= 0)
        h = (h + 1) & mask;
    t->merges[h] = (struct pp__merge_slot){left, right, rank, result};
    t->n_merges++;
}

int pp__tok_merge_add_str(struct pp_tokenizer *t, const char *a, size_t la, const char *b,
                          size_t lb, int32_t rank)
{
    char small[256];
    char *joined = la + lb <= sizeof(small) ? small : pp_alloc(PP_MEM_MISC, la + lb);
    if (!joined)
        return 0;
    memcpy(joined, a, la);
    memcpy(joined + la, b, lb);
    int32_t l = pp__tok_lookup(t, a, la), r = pp__tok_lookup(t, b, lb);
    int32_t res = pp__tok_lookup(t, joined, la + lb);
    if (joined != small)
        pp_free(PP_MEM_MISC, joined);
    if (l < 0 || r < 0 || res < 0)
        return 0;
    pp__tok_merge_add(t, l, r, rank, res);
    return 1;
}

static int cmp_special(const void *x, const void *y, void *ctx)
{
    const struct pp_tokenizer *sort_tok = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    uint8_t ca = (uint8_t)sort_tok->piece[a][0], cb = (uint8_t)sort_tok->piece[b][0];
    if (ca != cb)
        return ca - cb;
    if (sort_tok->len[a] != sort_tok->len[b])
        return sort_tok->len[b] - sort_tok->len[a]; /* longest first */
    return a - b;
}

static int is_special(const struct pp_tokenizer *t, int32_t i)
{
    return t->len[i] > 0 && (t->type[i] == PP__TT_CONTROL || t->type[i] == PP__TT_USER ||
                             t->type[i] == PP__TT_UNKNOWN);
}

pp_status pp__tok_specials_build(struct pp_tokenizer *t)
{
    int32_t n = 0;
    for (int32_t i = 0; i < t->n; i++)
        n += is_special(t, i);
    t->special_cap = 16;
    while (t->special_cap < 2 * (int64_t)n)
        t->special_cap <<= 1;
    t->special = pp_alloc(PP_MEM_MISC, ((size_t)n + 1) * sizeof(int32_t));
    t->special_len = pp_alloc(PP_MEM_MISC, ((size_t)n + 1) * sizeof(int32_t));
    t->special_hash = pp_alloc(PP_MEM_MISC, (size_t)t->special_cap * sizeof(int32_t));
    if (!t->special || !t->special_len || !t->special_hash)
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for %d special tokens", n);
    memset(t->special_hash, 0xff, (size_t)t->special_cap * sizeof(int32_t));
    uint64_t mask = (uint64_t)t->special_cap - 1;
    t->n_special = 0;
    for (int32_t i = 0; i < t->n; i++) {
        if (!is_special(t, i))
            continue;
        t->special[t->n_special++] = i;
        uint64_t h = hash_bytes(t->piece[i], (size_t)t->len[i]) & mask;
        int dup = 0;
        for (; t->special_hash[h] >= 0; h = (h + 1) & mask) {
            int32_t o = t->special_hash[h];
            dup |=
                t->len[o] == t->len[i] && memcmp(t->piece[o], t->piece[i], (size_t)t->len[i]) == 0;
        }
        if (!dup) /* the first id of a repeated piece wins */
            t->special_hash[h] = i;
    }
    qsort_r(t->special, (size_t)t->n_special, sizeof(int32_t), cmp_special, t);
    int32_t k = 0, m = 0;
    for (int c = 0; c < 256; c++) {
        t->len_at[c] = m;
        for (; k < t->n_special && (uint8_t)t->piece[t->special[k]][0] == c; k++)
            if (m == t->len_at[c] || t->special_len[m - 1] != t->len[t->special[k]])
                t->special_len[m++] = t->len[t->special[k]];
    }
    t->len_at[256] = m;
    return PP_OK;
}

int32_t pp__tok_special_match(const struct pp_tokenizer *t, const char *text, size_t i, size_t len)
{
    uint8_t c = (uint8_t)text[i];
    uint64_t mask = (uint64_t)t->special_cap - 1;
    for (int32_t k = t->len_at[c]; k < t->len_at[c + 1]; k++) {
        size_t n = (size_t)t->special_len[k];
        if (n > len - i)
            continue;
        for (uint64_t h = hash_bytes(text + i, n) & mask; t->special_hash[h] >= 0;
             h = (h + 1) & mask) {
            int32_t id = t->special_hash[h];
            if ((size_t)t->len[id] == n && memcmp(t->piece[id], text + i, n) == 0)
                return id;
        }
    }
    return -1;
}
