/* SentencePiece-style encoding and decoding. The vocabulary lives in one arena with an
 * open-addressing hash from piece to id. */
#include "model/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "model/gguf.h"
#include "model/source.h"
#ifdef PP_HAVE_JANSSON
#include <jansson.h>
#endif

enum tok_type { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

struct pp_tokenizer {
    int32_t n;
    char **piece;     /* [n] NUL-terminated */
    int32_t *len;     /* [n] */
    float *score;     /* [n] */
    uint8_t *type;    /* [n] */
    int32_t byte_id[256]; /* <0xXX> tokens, -1 when absent */
    int32_t *hash;    /* [hash_cap] ids, -1 empty */
    int64_t hash_cap;
    int32_t bos, eos, unk;
    int add_bos;
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int32_t lookup(const struct pp_tokenizer *t, const char *s, size_t n)
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

static pp_status alloc_vocab(struct pp_tokenizer *t, int32_t n)
{
    t->n = n;
    t->piece = pp_calloc(PP_MEM_MISC, (size_t)n, sizeof(char *));
    t->len = pp_calloc(PP_MEM_MISC, (size_t)n, sizeof(int32_t));
    t->score = pp_calloc(PP_MEM_MISC, (size_t)n, sizeof(float));
    t->type = pp_calloc(PP_MEM_MISC, (size_t)n, 1);
    t->hash_cap = 1;
    while (t->hash_cap < 2 * (int64_t)n)
        t->hash_cap <<= 1;
    t->hash = pp_alloc(PP_MEM_MISC, (size_t)t->hash_cap * sizeof(int32_t));
    if (!t->piece || !t->len || !t->score || !t->type || !t->hash)
        return PP_ERR_NOMEM;
    memset(t->hash, 0xff, (size_t)t->hash_cap * sizeof(int32_t));
    for (int i = 0; i < 256; i++)
        t->byte_id[i] = -1;
    t->bos = t->eos = t->unk = -1;
    return PP_OK;
}

static pp_status set_piece(struct pp_tokenizer *t, int32_t id, const char *s, size_t n)
{
    if (!(t->piece[id] = pp_strndup(PP_MEM_MISC, s, n)))
        return PP_ERR_NOMEM;
    t->len[id] = (int32_t)n;
    unsigned byte;
    char tail;
    if (n == 6 && sscanf(t->piece[id], "<0x%2X>%c", &byte, &tail) == 1) {
        t->byte_id[byte] = id;
        if (t->type[id] == 0 || t->type[id] == TOK_NORMAL)
            t->type[id] = TOK_BYTE;
    }
    if (lookup(t, s, n) >= 0)
        return PP_OK; /* duplicate piece: the first id wins */
    uint64_t mask = (uint64_t)t->hash_cap - 1;
    uint64_t h = hash_bytes(s, n) & mask;
    while (t->hash[h] >= 0)
        h = (h + 1) & mask;
    t->hash[h] = id;
    return PP_OK;
}

static pp_status load_gguf(struct pp_tokenizer *t, const struct pp_gguf *g, const char *path)
{
    struct pp_gguf_str model;
    if (pp_gguf_get_str(g, "tokenizer.ggml.model", &model) != PP_OK)
        return pp_error(PP_ERR_NOT_FOUND, "%s: no tokenizer (tokenizer.ggml.model absent); use "
                        "token ids", path);
    if (!(model.len == 5 && memcmp(model.ptr, "llama", 5) == 0))
        return pp_error(PP_ERR_UNSUPPORTED, "%s: tokenizer \"%.*s\" is not supported yet (only "
                        "\"llama\"); use token ids", path, (int)model.len, model.ptr);
    const struct pp_gguf_kv *toks = pp_gguf_find(g, "tokenizer.ggml.tokens");
    const struct pp_gguf_kv *scores = pp_gguf_find(g, "tokenizer.ggml.scores");
    const struct pp_gguf_kv *types = pp_gguf_find(g, "tokenizer.ggml.token_type");
    if (!toks || toks->type != PP_GGUF_ARRAY || toks->arr_type != PP_GGUF_STRING ||
        toks->arr_count == 0 || toks->arr_count > (1u << 24))
        return pp_error(PP_ERR_FORMAT, "%s: tokenizer.ggml.tokens must be a non-empty string array",
                        path);
    int32_t n = (int32_t)toks->arr_count;
    if (scores && (scores->type != PP_GGUF_ARRAY || scores->arr_type != PP_GGUF_F32 ||
                   scores->arr_count != (uint64_t)n))
        return pp_error(PP_ERR_FORMAT, "%s: tokenizer.ggml.scores must hold %d f32 values", path, n);
    if (types && (types->type != PP_GGUF_ARRAY || types->arr_type != PP_GGUF_I32 ||
                  types->arr_count != (uint64_t)n))
        return pp_error(PP_ERR_FORMAT, "%s: tokenizer.ggml.token_type must hold %d i32 values",
                        path, n);
    pp_status st = alloc_vocab(t, n);
    struct pp_gguf_str *strs = pp_alloc(PP_MEM_MISC, (size_t)n * sizeof(*strs));
    if (st != PP_OK || !strs) {
        pp_free(PP_MEM_MISC, strs);
        return PP_ERR_NOMEM;
    }
    pp_gguf_arr_strings(toks, strs);
    for (int32_t i = 0; i < n && st == PP_OK; i++) {
        if (types) {
            int32_t ty;
            memcpy(&ty, types->value + 4 * (size_t)i, 4);
            t->type[i] = (uint8_t)ty;
        }
        if (scores)
            memcpy(&t->score[i], scores->value + 4 * (size_t)i, 4);
        st = set_piece(t, i, strs[i].ptr, strs[i].len);
    }
    pp_free(PP_MEM_MISC, strs);
    if (st != PP_OK)
        return st;
    int64_t v;
    if (pp_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &v) == PP_OK && v >= 0 && v < n)
        t->bos = (int32_t)v;
    if (pp_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &v) == PP_OK && v >= 0 && v < n)
        t->eos = (int32_t)v;
    if (pp_gguf_get_i64(g, "tokenizer.ggml.unknown_token_id", &v) == PP_OK && v >= 0 && v < n)
        t->unk = (int32_t)v;
    t->add_bos = 1;
    int b;
    if (pp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == PP_OK)
        t->add_bos = b;
    return PP_OK;
}

#ifdef PP_HAVE_JANSSON
static int32_t id_of(json_t *vocab, const char *s)
{
    json_t *v = json_object_get(vocab, s);
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
}

static pp_status load_hf(struct pp_tokenizer *t, const char *dir, int32_t bos, int32_t eos)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root)
        return pp_error(PP_ERR_NOT_FOUND, "%s: no usable tokenizer.json (%s); use token ids", dir,
                        e.text);
    pp_status st = PP_OK;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE") != 0 || !json_is_object(vocab) || !json_is_array(merges) ||
        !json_is_true(json_object_get(model, "byte_fallback"))) {
        st = pp_error(PP_ERR_UNSUPPORTED, "%s: only BPE models with byte_fallback (SentencePiece "
                      "style) are supported yet; use token ids", path);
        goto done;
    }
    int32_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= (1 << 24)) {
            st = pp_error(PP_ERR_FORMAT, "%s: vocab[\"%s\"] is not a valid id", path, key);
            goto done;
        }
        if (json_integer_value(val) + 1 > n)
            n = (int32_t)json_integer_value(val) + 1;
    }
    json_t *added = json_object_get(root, "added_tokens");
    size_t ai;
    json_array_foreach(added, ai, val)
    {
        json_t *idv = json_object_get(val, "id");
        if (json_is_integer(idv) && json_integer_value(idv) >= n &&
            json_integer_value(idv) < (1 << 24))
            n = (int32_t)json_integer_value(idv) + 1;
    }
    if ((st = alloc_vocab(t, n)) != PP_OK)
        goto done;
    for (int32_t i = 0; i < n; i++)
        t->score[i] = -INFINITY;
    json_object_foreach(vocab, key, val)
    {
        int32_t id = (int32_t)json_integer_value(val);
        t->type[id] = TOK_NORMAL;
        if ((st = set_piece(t, id, key, strlen(key))) != PP_OK)
            goto done;
    }
    json_array_foreach(added, ai, val)
    {
        json_t *idv = json_object_get(val, "id");
        const char *content = json_string_value(json_object_get(val, "content"));
        if (!json_is_integer(idv) || !content)
            continue;
        int32_t id = (int32_t)json_integer_value(idv);
        t->type[id] = json_is_true(json_object_get(val, "special")) ? TOK_CONTROL : TOK_USER;
        if (!t->piece[id] && (st = set_piece(t, id, content, strlen(content))) != PP_OK)
            goto done;
    }
    for (int32_t i = 0; i < n; i++)
        if (!t->piece[i] && (st = set_piece(t, i, "", 0)) != PP_OK)
            goto done;
    size_t r;
    json_array_foreach(merges, r, val)
    {
        char joined[512];
        const char *a = NULL, *b = NULL;
        char left[256];
        if (json_is_string(val)) {
            const char *s = json_string_value(val), *sp = strchr(s, ' ');
            if (!sp || (size_t)(sp - s) >= sizeof(left))
                continue;
            memcpy(left, s, (size_t)(sp - s));
            left[sp - s] = '\0';
            a = left;
            b = sp + 1;
        } else if (json_is_array(val) && json_array_size(val) == 2) {
            a = json_string_value(json_array_get(val, 0));
            b = json_string_value(json_array_get(val, 1));
        }
        if (!a || !b || snprintf(joined, sizeof(joined), "%s%s", a, b) >= (int)sizeof(joined))
            continue;
        int32_t id = id_of(vocab, joined);
        if (id >= 0 && t->score[id] == -INFINITY)
            t->score[id] = -(float)r;
    }
    int32_t unk = id_of(vocab, "<unk>");
    t->unk = unk;
    t->bos = bos >= 0 && bos < n ? bos : -1;
    t->eos = eos >= 0 && eos < n ? eos : -1;
    t->add_bos = t->bos >= 0;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    json_t *tc = json_load_file(path, 0, &e);
    if (tc) {
        json_t *ab = json_object_get(tc, "add_bos_token");
        if (json_is_boolean(ab))
            t->add_bos = json_is_true(ab) && t->bos >= 0;
        json_decref(tc);
    }
done:
    json_decref(root);
    return st;
}
#endif

pp_status pp_tokenizer_load(const struct pp_model *m, struct pp_tokenizer **out)
{
    struct pp_tokenizer *t = pp_calloc(PP_MEM_MISC, 1, sizeof(*t));
    if (!t)
        return PP_ERR_NOMEM;
    pp_status st;
    if (m->source->format == PP_FORMAT_GGUF) {
        st = load_gguf(t, m->source->gguf, m->source->path);
    } else {
#ifdef PP_HAVE_JANSSON
        st = load_hf(t, m->source->path, m->cfg.bos_id, m->cfg.eos_id);
#else
        st = pp_error(PP_ERR_UNSUPPORTED, "tokenizer.json needs jansson, absent from this build");
#endif
    }
    if (st != PP_OK) {
        pp_tokenizer_free(t);
        return st;
    }
    *out = t;
    return PP_OK;
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
    pp_free(PP_MEM_MISC, t);
}

int32_t pp_tokenizer_vocab_size(const struct pp_tokenizer *t) { return t->n; }
int32_t pp_tokenizer_bos(const struct pp_tokenizer *t) { return t->bos; }
int32_t pp_tokenizer_eos(const struct pp_tokenizer *t) { return t->eos; }
int pp_tokenizer_add_bos(const struct pp_tokenizer *t) { return t->add_bos; }

/* Length of the UTF-8 character starting at s (1 for an invalid lead byte). */
static size_t utf8_len(const char *s, size_t avail)
{
    unsigned char c = (unsigned char)s[0];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (n > avail)
        return 1;
    for (size_t i = 1; i < n; i++)
        if (((unsigned char)s[i] & 0xc0) != 0x80)
            return 1;
    return n;
}

struct sym {
    int32_t start; /* offset into the normalised text */
    int32_t len;
    int32_t id;    /* token id; -1 before resolution */
};

pp_status pp_tokenizer_encode(const struct pp_tokenizer *t, const char *text, size_t len,
                              int add_bos, int32_t **ids_out, int32_t *n_out)
{
    if (len > ((size_t)1 << 26))
        return pp_error(PP_ERR_INVALID_ARG, "text of %zu bytes is too long to tokenize", len);
    /* normalise: prepend ▁ and turn every space into ▁ (3 bytes each) */
    static const char ws[] = "\xe2\x96\x81";
    char *norm = pp_alloc(PP_MEM_MISC, 3 * len + 4);
    struct sym *syms = pp_alloc(PP_MEM_MISC, (3 * len + 4) * sizeof(*syms));
    int32_t *ids = pp_alloc(PP_MEM_MISC, (4 * len + 8) * sizeof(int32_t));
    if (!norm || !syms || !ids) {
        pp_free(PP_MEM_MISC, norm);
        pp_free(PP_MEM_MISC, syms);
        pp_free(PP_MEM_MISC, ids);
        return PP_ERR_NOMEM;
    }
    size_t nl = 0;
    if (len > 0) {
        memcpy(norm, ws, 3);
        nl = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(norm + nl, ws, 3);
            nl += 3;
        } else {
            norm[nl++] = text[i];
        }
    }
    int32_t ns = 0;
    for (size_t i = 0; i < nl;) {
        size_t cl = utf8_len(norm + i, nl - i);
        syms[ns].start = (int32_t)i;
        syms[ns].len = (int32_t)cl;
        syms[ns].id = lookup(t, norm + i, cl);
        ns++;
        i += cl;
    }
    /* repeatedly merge the best-scoring adjacent pair whose concatenation is a token */
    for (;;) {
        int32_t best = -1, best_id = -1;
        float best_score = -INFINITY;
        for (int32_t i = 0; i + 1 < ns; i++) {
            int32_t id = lookup(t, norm + syms[i].start, (size_t)(syms[i].len + syms[i + 1].len));
            if (id >= 0 && t->score[id] > best_score) {
                best_score = t->score[id];
                best = i;
                best_id = id;
            }
        }
        if (best < 0)
            break;
        syms[best].len += syms[best + 1].len;
        syms[best].id = best_id;
        memmove(&syms[best + 1], &syms[best + 2], (size_t)(ns - best - 2) * sizeof(*syms));
        ns--;
    }
    int32_t n = 0;
    if (add_bos && t->bos >= 0)
        ids[n++] = t->bos;
    for (int32_t i = 0; i < ns; i++) {
        if (syms[i].id >= 0) {
            ids[n++] = syms[i].id;
            continue;
        }
        for (int32_t b = 0; b < syms[i].len; b++) {
            int32_t bid = t->byte_id[(uint8_t)norm[syms[i].start + b]];
            ids[n++] = bid >= 0 ? bid : t->unk >= 0 ? t->unk : 0;
        }
    }
    pp_free(PP_MEM_MISC, norm);
    pp_free(PP_MEM_MISC, syms);
    *ids_out = ids;
    *n_out = n;
    return PP_OK;
}

int pp_tokenizer_piece(const struct pp_tokenizer *t, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n)
        return -1;
    if (t->type[id] == TOK_CONTROL || t->type[id] == TOK_UNKNOWN || t->type[id] == TOK_UNUSED)
        return 0;
    if (t->type[id] == TOK_BYTE) {
        unsigned byte;
        if (sscanf(t->piece[id], "<0x%2X>", &byte) == 1) {
            if (cap > 0)
                buf[0] = (char)byte;
            return 1;
        }
    }
    size_t n = 0;
    const char *p = t->piece[id];
    for (int32_t i = 0; i < t->len[id];) {
        if (i + 3 <= t->len[id] && memcmp(p + i, "\xe2\x96\x81", 3) == 0) {
            if (n < cap)
                buf[n] = ' ';
            n++;
            i += 3;
        } else {
            if (n < cap)
                buf[n] = p[i];
            n++;
            i++;
        }
    }
    return (int)n;
}
