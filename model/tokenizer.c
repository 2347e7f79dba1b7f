/* The tokenizer's public face: loading (dispatch to the GGUF and tokenizer.json loaders), the
 * encoding pipeline (special tokens → per-segment normalizer → pre-tokenizer steps → merges) and
 * decoding token ids back to raw bytes. */
#include "model/tokenizer.h"

#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "model/gguf.h"
#include "model/source.h"
#include "model/tokenizer-impl.h"

#define MAX_TEXT ((size_t)256 << 20)

static struct pp_tokenizer *tok_new(void)
{
    struct pp_tokenizer *t = pp_calloc(PP_MEM_MISC, 1, sizeof(*t));
    if (!t)
        return NULL;
    for (int i = 0; i < 256; i++)
        t->byte_id[i] = -1;
    t->bos = t->eos = t->unk = -1;
    return t;
}

void pp_tokenizer_free(struct pp_tokenizer *t)
{
    if (!t)
        return;
    if (t->piece)
        for (int32_t i = 0; i < t->n; i++)
            pp_free(PP_MEM_MISC, t->piece[i]);
    pp_free(PP_MEM_MISC, t->piece);
    pp_free(PP_MEM_MISC, t->len);
    pp_free(PP_MEM_MISC, t->score);
    pp_free(PP_MEM_MISC, t->type);
    pp_free(PP_MEM_MISC, t->hash);
    pp_free(PP_MEM_MISC, t->merges);
    pp_free(PP_MEM_MISC, t->special);
    pp_free(PP_MEM_MISC, t->special_hash);
    pp_free(PP_MEM_MISC, t->special_len);
    for (int i = 0; i < t->n_norm; i++) {
        pp_free(PP_MEM_MISC, t->norm[i].a);
        pp_free(PP_MEM_MISC, t->norm[i].b);
    }
    for (int i = 0; i < t->n_pre; i++) {
        if (t->pre[i].re)
            pp__tok_regex_free(t->pre[i].re);
        pp_free(PP_MEM_MISC, t->pre[i].replacement);
    }
    pp_free(PP_MEM_MISC, t);
}

/* Every symbol merging makes is a token, so when no token holds a ▁ right after a character other
 * than ▁, no merge can join the text on both sides of such a ▁: cutting the text there gives the
 * same ids and keeps the merge heaps small (SentencePiece texts have one per word). */
static int can_split_at_meta(const struct pp_tokenizer *t)
{
    if (t->byte_level || t->n_pre > 0)
        return 0;
    for (int32_t i = 0; i < t->n; i++) {
        const char *p = t->piece[i];
        size_t n = (size_t)t->len[i];
        for (size_t k = 1; k + 3 <= n; k++)
            if (memcmp(p + k, PP__META, 3) == 0 && (k < 3 || memcmp(p + k - 3, PP__META, 3) != 0))
                return 0;
    }
    return 1;
}

static pp_status finish_load(struct pp_tokenizer *t, pp_status st, struct pp_tokenizer **out)
{
    if (st == PP_OK)
        st = pp__tok_fill_missing(t);
    if (st == PP_OK)
        st = pp__tok_specials_build(t);
    if (st != PP_OK) {
        pp_tokenizer_free(t);
        return st;
    }
    if (t->bos < 0)
        t->add_bos = 0;
    t->split_at_meta = can_split_at_meta(t);
    *out = t;
    return PP_OK;
}

pp_status pp_tokenizer_load(const struct pp_model *m, struct pp_tokenizer **out)
{
    struct pp_tokenizer *t = tok_new();
    if (!t)
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory");
    pp_status st;
    if (m->source->format == PP_FORMAT_GGUF)
        st = pp__tok_load_gguf(t, m->source->gguf, m->source->path);
    else
        st = pp__tok_load_json(t, m->source->path, m->cfg.bos_id, m->cfg.eos_id, 0);
    return finish_load(t, st, out);
}

pp_status pp_tokenizer_open(const char *path, struct pp_tokenizer **out)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return pp_error(PP_ERR_IO, "%s: no such file or folder", path);
    struct pp_tokenizer *t = tok_new();
    if (!t)
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory");
    pp_status st;
    if (S_ISDIR(sb.st_mode)) {
        st = pp__tok_load_json(t, path, -1, -1, 1);
    } else {
        struct pp_gguf *g = NULL;
        st = pp_gguf_open(path, &g);
        if (st == PP_OK)
            st = pp__tok_load_gguf(t, g, path);
        pp_gguf_free(g);
    }
    return finish_load(t, st, out);
}

enum pp_tokenizer_kind pp_tokenizer_kind(const struct pp_tokenizer *t)
{
    return t->kind;
}
int32_t pp_tokenizer_vocab_size(const struct pp_tokenizer *t)
{
    return t->n;
}
int32_t pp_tokenizer_bos(const struct pp_tokenizer *t)
{
    return t->bos;
}
int32_t pp_tokenizer_eos(const struct pp_tokenizer *t)
{
    return t->eos;
}
int pp_tokenizer_add_bos(const struct pp_tokenizer *t)
{
    return t->add_bos && t->bos >= 0;
}

const char *pp_tokenizer_kind_name(enum pp_tokenizer_kind k)
{
    return k == PP_TOKENIZER_SPM ? "spm" : k == PP_TOKENIZER_BPE ? "bpe" : "byte-bpe";
}

/* ---- encoding ---- */

struct enc {
    const struct pp_tokenizer *t;
    struct pp_buf a, b;      /* segment text, and scratch for rewriting it */
    struct pp__spans s1, s2; /* pieces, and scratch for splitting them */
    struct pp__merge_scratch ms;
    struct pp_buf ids; /* int32 ids */
};

static void enc_free(struct enc *e)
{
    pp_buf_free(&e->a);
    pp_buf_free(&e->b);
    pp_free(PP_MEM_MISC, e->s1.v);
    pp_free(PP_MEM_MISC, e->s2.v);
    pp__merge_scratch_free(&e->ms);
    pp_buf_free(&e->ids);
}

static void put_replaced(struct pp_buf *out, const char *s, size_t n, const char *pat, size_t lp,
                         const char *rep, size_t lr)
{
    size_t i = 0;
    while (i < n) {
        const char *hit = lp <= n - i ? memmem(s + i, n - i, pat, lp) : NULL;
        size_t upto = hit ? (size_t)(hit - s) : n;
        pp_buf_put(out, s + i, upto - i);
        if (!hit)
            break;
        pp_buf_put(out, rep, lr);
        i = upto + lp;
    }
}

/* The normalizer: e->a = normalized text[0..n). */
static void normalize(struct enc *e, const char *text, size_t n)
{
    const struct pp_tokenizer *t = e->t;
    e->a.len = 0;
    pp_buf_put(&e->a, text, n);
    for (int i = 0; i < t->n_norm; i++) {
        const struct pp__norm_op *op = &t->norm[i];
        if (e->a.len == 0)
            break; /* every op keeps empty text empty (Prepend skips it) */
        e->b.len = 0;
        if (op->kind == PP__NORM_PREPEND) {
            pp_buf_puts(&e->b, op->a);
            pp_buf_put(&e->b, e->a.data, e->a.len);
        } else {
            put_replaced(&e->b, e->a.data, e->a.len, op->a, strlen(op->a), op->b, strlen(op->b));
        }
        struct pp_buf tmp = e->a;
        e->a = e->b;
        e->b = tmp;
    }
}

/* Metaspace or ByteLevel's prefix space: rewrites every piece into e->b, then swaps it in. */
static pp_status rewrite(struct enc *e, const struct pp__pre_step *st, int first_segment)
{
    e->b.len = 0;
    e->s2.n = 0;
    pp_status rc = PP_OK;
    for (size_t i = 0; i < e->s1.n && rc == PP_OK; i++) {
        const char *p = e->a.data + e->s1.v[i].start;
        size_t n = e->s1.v[i].len, begin = e->b.len;
        if (st->kind == PP__PRE_PREFIX) {
            if (n == 0 || p[0] != ' ')
                pp_buf_put(&e->b, " ", 1);
            pp_buf_put(&e->b, p, n);
            rc = pp__spans_push(&e->s2, begin, e->b.len - begin);
            continue;
        }
        size_t lr = strlen(st->replacement);
        put_replaced(&e->b, p, n, " ", 1, st->replacement, lr);
        int want = st->prepend == PP__PREPEND_ALWAYS ||
                   (st->prepend == PP__PREPEND_FIRST && first_segment && e->s1.v[i].start == 0);
        if (want && (e->b.len - begin < lr || memcmp(e->b.data + begin, st->replacement, lr))) {
            if (!pp_buf_reserve(&e->b, lr))
                break;
            memmove(e->b.data + begin + lr, e->b.data + begin, e->b.len - begin);
            memcpy(e->b.data + begin, st->replacement, lr);
            e->b.len += lr;
            e->b.data[e->b.len] = '\0'; /* pp_buf keeps its data NUL-terminated */
        }
        if (!st->split || lr == 0) {
            rc = pp__spans_push(&e->s2, begin, e->b.len - begin);
            continue;
        }
        size_t from = begin; /* split before every replacement after the piece's first byte */
        for (size_t j = begin + 1; j + lr <= e->b.len && rc == PP_OK; j++) {
            if (memcmp(e->b.data + j, st->replacement, lr) == 0) {
                rc = pp__spans_push(&e->s2, from, j - from);
                from = j;
            }
        }
        if (rc == PP_OK && from < e->b.len)
            rc = pp__spans_push(&e->s2, from, e->b.len - from);
    }
    if (e->b.failed)
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for the pre-tokenized text");
    struct pp_buf tb = e->a;
    e->a = e->b;
    e->b = tb;
    struct pp__spans ts = e->s1;
    e->s1 = e->s2;
    e->s2 = ts;
    return rc;
}

static pp_status encode_segment(struct enc *e, const char *text, size_t n, int first_segment)
{
    const struct pp_tokenizer *t = e->t;
    normalize(e, text, n);
    if (e->a.failed || e->b.failed)
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for %zu bytes of text", n);
    e->s1.n = 0;
    pp_status st = PP_OK;
    size_t from = 0;
    if (t->split_at_meta)
        for (size_t j = 1; j + 3 <= e->a.len && st == PP_OK; j++)
            if (memcmp(e->a.data + j, PP__META, 3) == 0 &&
                (j < 3 || memcmp(e->a.data + j - 3, PP__META, 3) != 0)) {
                st = pp__spans_push(&e->s1, from, j - from);
                from = j;
            }
    if (st == PP_OK && from < e->a.len)
        st = pp__spans_push(&e->s1, from, e->a.len - from);
    for (int i = 0; i < t->n_pre && st == PP_OK && e->s1.n > 0; i++) {
        const struct pp__pre_step *step = &t->pre[i];
        if (step->kind == PP__PRE_SPLIT) {
            e->s2.n = 0;
            st = pp__tok_regex_split(step->re, e->a.data, &e->s1, &e->s2);
            struct pp__spans tmp = e->s1;
            e->s1 = e->s2;
            e->s2 = tmp;
        } else {
            st = rewrite(e, step, first_segment);
        }
    }
    for (size_t i = 0; i < e->s1.n && st == PP_OK; i++)
        st = pp__tok_encode_piece(t, e->a.data + e->s1.v[i].start, e->s1.v[i].len, &e->ms, &e->ids);
    return st;
}

pp_status pp_tokenizer_encode_ex(const struct pp_tokenizer *t, const char *text, size_t len,
                                 unsigned flags, int32_t **ids_out, int32_t *n_out)
{
    if (len > MAX_TEXT)
        return pp_error(PP_ERR_INVALID_ARG,
                        "text of %zu bytes is too long to tokenize (at most "
                        "%zu)",
                        len, MAX_TEXT);
    struct enc e = {.t = t};
    pp_status st = PP_OK;
    if ((flags & PP_TOKENIZE_ADD_BOS) && t->bos >= 0)
        pp_buf_put(&e.ids, &t->bos, sizeof(int32_t));
    int specials = (flags & PP_TOKENIZE_PARSE_SPECIAL) && t->n_special > 0;
    size_t seg = 0;
    for (size_t i = 0; i < len && st == PP_OK; i++) {
        int32_t id = specials ? pp__tok_special_match(t, text, i, len) : -1;
        if (id < 0)
            continue;
        if (i > seg)
            st = encode_segment(&e, text + seg, i - seg, seg == 0);
        pp_buf_put(&e.ids, &id, sizeof(id));
        seg = i + (size_t)t->len[id];
        i = seg - 1;
    }
    if (st == PP_OK && seg < len)
        st = encode_segment(&e, text + seg, len - seg, seg == 0);
    if (st == PP_OK && (e.ids.failed || !pp_buf_reserve(&e.ids, sizeof(int32_t))))
        st = pp_error(PP_ERR_NOMEM, "tokenizer: no memory for the ids of %zu bytes", len);
    if (st != PP_OK) {
        enc_free(&e);
        return st;
    }
    *n_out = (int32_t)(e.ids.len / sizeof(int32_t));
    *ids_out = (int32_t *)e.ids.data; /* pp_buf data is pp_alloc(PP_MEM_MISC) */
    e.ids.data = NULL;
    enc_free(&e);
    return PP_OK;
}

pp_status pp_tokenizer_encode(const struct pp_tokenizer *t, const char *text, size_t len,
                              int add_bos, int32_t **ids, int32_t *n_ids)
{
    return pp_tokenizer_encode_ex(
        t, text, len, PP_TOKENIZE_PARSE_SPECIAL | (add_bos ? PP_TOKENIZE_ADD_BOS : 0u), ids, n_ids);
}

/* ---- decoding ---- */

static size_t put(char *buf, size_t cap, size_t n, const char *s, size_t k)
{
    for (size_t i = 0; i < k; i++, n++)
        if (n < cap)
            buf[n] = s[i];
    return n;
}

int pp_tokenizer_piece(const struct pp_tokenizer *t, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n)
        return -1;
    uint8_t ty = t->type[id];
    if (ty == PP__TT_CONTROL || ty == PP__TT_UNKNOWN || ty == PP__TT_UNUSED)
        return 0;
    const char *p = t->piece[id];
    size_t len = (size_t)t->len[id], n = 0;
    if (ty == PP__TT_BYTE && !t->byte_level) {
        for (int b = 0; b < 256; b++)
            if (t->byte_id[b] == id) {
                char c = (char)b;
                return (int)put(buf, cap, 0, &c, 1);
            }
    }
    if (ty == PP__TT_USER)
        return (int)put(buf, cap, 0, p, len);
    for (size_t i = 0; i < len;) {
        const unsigned char *u = (const unsigned char *)p + i;
        if (t->byte_level && u[0] >= 0x80 && (u[0] & 0xe0) == 0xc0 && i + 1 < len &&
            (u[1] & 0xc0) == 0x80) {
            int b = pp__tok_char_to_byte((uint32_t)(u[0] & 0x1f) << 6 | (u[1] & 0x3f));
            char c = (char)b;
            n = b >= 0 ? put(buf, cap, n, &c, 1) : put(buf, cap, n, p + i, 2);
            i += 2;
        } else if (t->byte_level && u[0] < 0x80) {
            int b = pp__tok_char_to_byte(u[0]);
            char c = (char)b;
            n = put(buf, cap, n, b >= 0 ? &c : p + i, 1);
            i++;
        } else if (t->meta_decode && i + 3 <= len && memcmp(u, PP__META, 3) == 0) {
            n = put(buf, cap, n, " ", 1);
            i += 3;
        } else {
            n = put(buf, cap, n, p + i, 1);
            i++;
        }
    }
    return (int)n;
}

pp_status pp_tokenizer_decode(const struct pp_tokenizer *t, const int32_t *ids, int32_t n,
                              char **text, size_t *len)
{
    struct pp_buf out = {0};
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n) {
            pp_buf_free(&out);
            return pp_error(PP_ERR_OUT_OF_RANGE,
                            "token id %d (at %d) is outside the vocabulary "
                            "of %d tokens",
                            ids[i], i, t->n);
        }
        int k = pp_tokenizer_piece(t, ids[i], NULL, 0);
        if (k > 0 && pp_buf_reserve(&out, (size_t)k)) {
            pp_tokenizer_piece(t, ids[i], out.data + out.len, (size_t)k);
            out.len += (size_t)k;
            out.data[out.len] = '\0';
        }
    }
    if (!pp_buf_reserve(&out, 1)) {
        pp_buf_free(&out);
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory to decode %d ids", n);
    }
    size_t skip = t->strip_space && out.len > 0 && out.data[0] == ' ';
    memmove(out.data, out.data + skip, out.len - skip + 1);
    *text = out.data;
    *len = out.len - skip;
    return PP_OK;
}
