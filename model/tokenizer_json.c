/* The tokenizer of an HF checkpoint: tokenizer.json (model BPE with vocab, merges as "a b" strings
 * or [a, b] pairs, byte_fallback, ignore_merges; added_tokens; normalizer Sequence / Prepend /
 * Replace (literal patterns) / NFC; pre_tokenizer Sequence / Split (Regex or String pattern,
 * Isolated) / ByteLevel / Metaspace; decoder Replace / Strip / Metaspace / ByteLevel) plus
 * tokenizer_config.json (add_bos_token, bos_token) and, for pp_tokenizer_open, config.json's
 * bos/eos ids. Anything else is reported as PP_ERR_UNSUPPORTED so the model still runs from ids.
 *
 * Known approximations: NFC is taken as the identity (text that is already NFC, which is nearly
 * all text, tokenizes exactly); added tokens are all matched in the raw text (HF matches the
 * non-special ones with normalized=true after normalization) and lstrip/rstrip are ignored. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "model/tokenizer-impl.h"

#ifdef PP_HAVE_JANSSON
#include <jansson.h>

static int is_type(json_t *o, const char *type)
{
    const char *s = json_string_value(json_object_get(o, "type"));
    return s && strcmp(s, type) == 0;
}

static pp_status unsupported(const char *path, const char *what, json_t *o)
{
    const char *type = json_string_value(json_object_get(o, "type"));
    return pp_error(PP_ERR_UNSUPPORTED, "%s: %s \"%s\" is not supported; use token ids", path, what,
                    type ? type : "(no type)");
}

static char *dup_str(json_t *v)
{
    const char *s = json_string_value(v);
    return s ? pp_strdup(PP_MEM_MISC, s) : NULL;
}

static pp_status add_norm_op(struct pp_tokenizer *t, const char *path, json_t *o)
{
    if (t->n_norm == PP__MAX_NORM)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: more than %d normalizers", path, PP__MAX_NORM);
    struct pp__norm_op op = {0};
    if (is_type(o, "Prepend")) {
        op.kind = PP__NORM_PREPEND;
        op.a = dup_str(json_object_get(o, "prepend"));
    } else if (is_type(o, "Replace")) {
        json_t *pat = json_object_get(o, "pattern");
        if (!json_string_value(json_object_get(pat, "String")))
            return pp_error(PP_ERR_UNSUPPORTED,
                            "%s: Replace normalizer with a Regex pattern is not "
                            "supported; use token ids",
                            path);
        op.kind = PP__NORM_REPLACE;
        op.a = dup_str(json_object_get(pat, "String"));
        op.b = dup_str(json_object_get(o, "content"));
        if (op.a && !op.a[0]) {
            pp_free(PP_MEM_MISC, op.a);
            pp_free(PP_MEM_MISC, op.b);
            return PP_OK; /* an empty pattern replaces nothing */
        }
        if (op.a && op.b && strcmp(op.a, " ") == 0 && strcmp(op.b, PP__META) == 0)
            t->meta_decode = 1;
        if (!op.b) {
            pp_free(PP_MEM_MISC, op.a);
            op.a = NULL;
        }
    } else if (is_type(o, "NFC")) {
        return PP_OK; /* identity on NFC text; see the file comment */
    } else {
        return unsupported(path, "normalizer", o);
    }
    if (!op.a)
        return pp_error(PP_ERR_FORMAT, "%s: normalizer %s lacks its strings", path,
                        json_string_value(json_object_get(o, "type")));
    t->norm[t->n_norm++] = op;
    return PP_OK;
}

static pp_status read_normalizer(struct pp_tokenizer *t, const char *path, json_t *n)
{
    if (!n || json_is_null(n))
        return PP_OK;
    if (!is_type(n, "Sequence"))
        return add_norm_op(t, path, n);
    size_t i;
    json_t *o;
    pp_status st = PP_OK;
    json_array_foreach(json_object_get(n, "normalizers"), i, o)
    {
        if ((st = add_norm_op(t, path, o)))
            break;
    }
    return st;
}

/* Escapes a literal for PCRE2 (\Q...\E cannot hold "\E"). */
static char *quote_literal(const char *s)
{
    size_t n = strlen(s);
    char *q = pp_alloc(PP_MEM_MISC, 2 * n + 1), *p = q;
    if (!q)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (strchr("\\^$.|?*+()[]{}", s[i]))
            *p++ = '\\';
        *p++ = s[i];
    }
    *p = '\0';
    return q;
}

static pp_status add_pre(struct pp_tokenizer *t, const char *path, json_t *o)
{
    if (t->n_pre >= PP__MAX_PRE - 1)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizers", path,
                        PP__MAX_PRE - 1);
    struct pp__pre_step *st = &t->pre[t->n_pre];
    memset(st, 0, sizeof(*st));
    if (is_type(o, "Split")) {
        json_t *pat = json_object_get(o, "pattern");
        const char *behavior = json_string_value(json_object_get(o, "behavior"));
        if (json_is_true(json_object_get(o, "invert")) ||
            (behavior && strcmp(behavior, "Isolated")))
            return pp_error(PP_ERR_UNSUPPORTED,
                            "%s: Split pre-tokenizer with behavior \"%s\"%s is "
                            "not supported (only Isolated); use token ids",
                            path, behavior ? behavior : "?",
                            json_is_true(json_object_get(o, "invert")) ? " and invert" : "");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (!re && !lit)
            return pp_error(PP_ERR_FORMAT, "%s: Split pre-tokenizer without a pattern", path);
        char *q = lit ? quote_literal(lit) : NULL;
        if (lit && !q)
            return pp_error(PP_ERR_NOMEM, "tokenizer: no memory");
        pp_status rc = pp__tok_regex_compile(q ? q : re, strlen(q ? q : re), &st->re);
        pp_free(PP_MEM_MISC, q);
        if (rc)
            return rc;
        st->kind = PP__PRE_SPLIT;
        t->n_pre++;
        return PP_OK;
    }
    if (is_type(o, "ByteLevel")) {
        t->byte_level = 1;
        int prefix = json_is_true(json_object_get(o, "add_prefix_space"));
        json_t *ur = json_object_get(o, "use_regex");
        int use_regex = !json_is_boolean(ur) || json_is_true(ur); /* HF default: true */
        if (prefix) {
            st->kind = PP__PRE_PREFIX;
            t->n_pre++;
        }
        if (use_regex) {
            const char *re = pp__tok_family_regex("gpt2");
            struct pp__pre_step *s2 = &t->pre[t->n_pre];
            memset(s2, 0, sizeof(*s2));
            s2->kind = PP__PRE_SPLIT;
            pp_status rc = pp__tok_regex_compile(re, strlen(re), &s2->re);
            if (rc)
                return rc;
            t->n_pre++;
        }
        return PP_OK;
    }
    if (is_type(o, "Metaspace")) {
        st->kind = PP__PRE_METASPACE;
        const char *rep = json_string_value(json_object_get(o, "replacement"));
        st->replacement = pp_strdup(PP_MEM_MISC, rep ? rep : PP__META);
        if (!st->replacement)
            return pp_error(PP_ERR_NOMEM, "tokenizer: no memory");
        const char *scheme = json_string_value(json_object_get(o, "prepend_scheme"));
        if (scheme)
            st->prepend = strcmp(scheme, "always") == 0  ? PP__PREPEND_ALWAYS
                          : strcmp(scheme, "first") == 0 ? PP__PREPEND_FIRST
                                                         : PP__PREPEND_NEVER;
        else /* older files: add_prefix_space */
            st->prepend = json_is_false(json_object_get(o, "add_prefix_space"))
                              ? PP__PREPEND_NEVER
                              : PP__PREPEND_ALWAYS;
        json_t *split = json_object_get(o, "split");
        st->split = !json_is_boolean(split) || json_is_true(split);
        t->meta_decode = 1;
        t->n_pre++;
        return PP_OK;
    }
    return unsupported(path, "pre_tokenizer", o);
}

static pp_status read_pre(struct pp_tokenizer *t, const char *path, json_t *p)
{
    if (!p || json_is_null(p))
        return PP_OK;
    if (!is_type(p, "Sequence"))
        return add_pre(t, path, p);
    size_t i;
    json_t *o;
    pp_status st = PP_OK;
    json_array_foreach(json_object_get(p, "pretokenizers"), i, o)
    {
        if ((st = add_pre(t, path, o)))
            break;
    }
    return st;
}

static void read_decoder_one(struct pp_tokenizer *t, json_t *d)
{
    if (is_type(d, "Strip") && json_integer_value(json_object_get(d, "start")) > 0)
        t->strip_space = 1;
    if (is_type(d, "Replace") &&
        json_string_value(json_object_get(json_object_get(d, "pattern"), "String")) &&
        strcmp(json_string_value(json_object_get(json_object_get(d, "pattern"), "String")),
               PP__META) == 0)
        t->meta_decode = 1;
    if (is_type(d, "Metaspace")) {
        const char *scheme = json_string_value(json_object_get(d, "prepend_scheme"));
        t->meta_decode = 1;
        t->strip_space = scheme ? strcmp(scheme, "never") != 0
                                : !json_is_false(json_object_get(d, "add_prefix_space"));
    }
}

static void read_decoder(struct pp_tokenizer *t, json_t *d)
{
    if (is_type(d, "Sequence")) {
        size_t i;
        json_t *o;
        json_array_foreach(json_object_get(d, "decoders"), i, o) read_decoder_one(t, o);
    } else if (d) {
        read_decoder_one(t, d);
    }
}

/* Splits merge r into its two pieces; 0 when malformed. */
static int merge_parts(json_t *m, const char **a, size_t *la, const char **b, size_t *lb)
{
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (!sp)
            return 0;
        *a = s;
        *la = (size_t)(sp - s);
        *b = sp + 1;
        *lb = n - *la - 1;
        return 1;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *la = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *lb = json_string_length(json_array_get(m, 1));
        return 1;
    }
    return 0;
}

static pp_status read_model(struct pp_tokenizer *t, const char *path, json_t *root)
{
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!is_type(model, "BPE") && !(json_object_get(model, "type") == NULL && merges))
        return unsupported(path, "tokenizer model", model);
    if (!json_is_object(vocab) || !json_is_array(merges))
        return pp_error(PP_ERR_FORMAT,
                        "%s: a BPE model needs model.vocab (object) and "
                        "model.merges (array)",
                        path);
    int32_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= (1 << 24))
            return pp_error(PP_ERR_FORMAT, "%s: vocab[\"%s\"] is not an id in [0, 2^24)", path,
                            key);
        if (json_integer_value(val) + 1 > n)
            n = (int32_t)json_integer_value(val) + 1;
    }
    json_t *added = json_object_get(root, "added_tokens");
    size_t ai;
    json_array_foreach(added, ai, val)
    {
        json_t *idv = json_object_get(val, "id");
        if (!json_is_integer(idv) || json_integer_value(idv) < 0 ||
            json_integer_value(idv) >= (1 << 24) ||
            !json_string_value(json_object_get(val, "content")))
            return pp_error(PP_ERR_FORMAT,
                            "%s: added_tokens[%zu] needs an id in [0, 2^24) and a "
                            "content string",
                            path, ai);
        if (json_integer_value(idv) + 1 > n)
            n = (int32_t)json_integer_value(idv) + 1;
    }
    if (n == 0)
        return pp_error(PP_ERR_FORMAT, "%s: the vocabulary is empty", path);
    pp_status st = pp__tok_vocab_alloc(t, n);
    if (st)
        return st;
    /* added tokens first, so that their type holds when the vocab repeats them */
    json_array_foreach(added, ai, val)
    {
        int32_t id = (int32_t)json_integer_value(json_object_get(val, "id"));
        json_t *c = json_object_get(val, "content");
        t->type[id] = json_is_true(json_object_get(val, "special")) ? PP__TT_CONTROL : PP__TT_USER;
        if ((st = pp__tok_set_piece(t, id, json_string_value(c), json_string_length(c))))
            return st;
    }
#ifdef json_object_keylen_foreach /* jansson >= 2.14: keys may hold "\u0000" */
    size_t klen;
    json_object_keylen_foreach(vocab, key, klen, val)
#else
    json_object_foreach(vocab, key, val)
#endif
    {
        int32_t id = (int32_t)json_integer_value(val);
        if (t->type[id] == 0)
            t->type[id] = PP__TT_NORMAL;
#ifndef json_object_keylen_foreach
        size_t klen = strlen(key);
#endif
        if ((st = pp__tok_set_piece(t, id, key, klen)))
            return st;
    }
    if ((st = pp__tok_merges_alloc(t, (int64_t)json_array_size(merges))))
        return st;
    size_t r;
    json_array_foreach(merges, r, val)
    {
        const char *a, *b;
        size_t la, lb;
        if (merge_parts(val, &a, &la, &b, &lb))
            pp__tok_merge_add_str(t, a, la, b, lb, (int32_t)r);
    }
    t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk)
        t->unk = pp__tok_lookup(t, unk, strlen(unk));
    return PP_OK;
}

/* The id of a token given as "text" or {"content": "text"} (tokenizer_config.json). */
static int32_t token_ref(const struct pp_tokenizer *t, json_t *v)
{
    const char *s =
        json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "content"));
    return s ? pp__tok_lookup(t, s, strlen(s)) : -1;
}

/* A TemplateProcessing whose single sequence starts with a special token: that token is BOS and is
 * added. Returns its id or -1. */
static int32_t template_bos(const struct pp_tokenizer *t, json_t *pp)
{
    if (is_type(pp, "Sequence")) {
        size_t i;
        json_t *o;
        json_array_foreach(json_object_get(pp, "processors"), i, o)
        {
            int32_t id = template_bos(t, o);
            if (id >= 0)
                return id;
        }
        return -1;
    }
    if (!is_type(pp, "TemplateProcessing"))
        return -1;
    json_t *first =
        json_object_get(json_array_get(json_object_get(pp, "single"), 0), "SpecialToken");
    const char *name = json_string_value(json_object_get(first, "id"));
    if (!name)
        return -1;
    json_t *spec = json_object_get(json_object_get(pp, "special_tokens"), name);
    json_t *ids = json_object_get(spec, "ids");
    if (json_is_integer(json_array_get(ids, 0)))
        return (int32_t)json_integer_value(json_array_get(ids, 0));
    return pp__tok_lookup(t, name, strlen(name));
}

static void read_config_ids(const char *dir, int32_t *bos, int32_t *eos)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    if (!c)
        return;
    json_t *b = json_object_get(c, "bos_token_id"), *e = json_object_get(c, "eos_token_id");
    if (json_is_integer(b))
        *bos = (int32_t)json_integer_value(b);
    if (json_is_array(e))
        e = json_array_get(e, 0);
    if (json_is_integer(e))
        *eos = (int32_t)json_integer_value(e);
    json_decref(c);
}

static void read_bos_setting(struct pp_tokenizer *t, const char *dir, json_t *root, int32_t bos,
                             int32_t eos)
{
    int32_t tb = template_bos(t, json_object_get(root, "post_processor"));
    t->bos = bos >= 0 && bos < t->n ? bos : tb >= 0 && tb < t->n ? tb : -1;
    t->eos = eos >= 0 && eos < t->n ? eos : -1;
    t->add_bos = tb >= 0;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    json_t *tc = json_load_file(path, 0, NULL);
    if (!tc)
        return;
    json_t *ab = json_object_get(tc, "add_bos_token");
    if (t->bos < 0) {
        int32_t id = token_ref(t, json_object_get(tc, "bos_token"));
        t->bos = id;
    }
    if (t->eos < 0)
        t->eos = token_ref(t, json_object_get(tc, "eos_token"));
    if (json_is_boolean(ab))
        t->add_bos = json_is_true(ab);
    json_decref(tc);
}

pp_status pp__tok_load_json(struct pp_tokenizer *t, const char *dir, int32_t bos, int32_t eos,
                            int read_config)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root)
        return pp_error(PP_ERR_NOT_FOUND, "%s: no usable tokenizer.json (%s); use token ids", dir,
                        e.text);
    pp_status st;
    if (!(st = read_model(t, path, root)) &&
        !(st = read_normalizer(t, path, json_object_get(root, "normalizer"))) &&
        !(st = read_pre(t, path, json_object_get(root, "pre_tokenizer")))) {
        read_decoder(t, json_object_get(root, "decoder"));
        if (read_config && bos < 0 && eos < 0)
            read_config_ids(dir, &bos, &eos);
        read_bos_setting(t, dir, root, bos, eos);
        t->kind = t->byte_level ? PP_TOKENIZER_BYTE_BPE : PP_TOKENIZER_BPE;
    }
    json_decref(root);
    return st;
}

#else

pp_status pp__tok_load_json(struct pp_tokenizer *t, const char *dir, int32_t bos, int32_t eos,
                            int read_config)
{
    return pp_error(PP_ERR_UNSUPPORTED,
                    "%s: tokenizer.json needs jansson, absent from this build; "
                    "use token ids",
                    dir);
}

#endif
