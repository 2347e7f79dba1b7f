/* Pre-tokenizer regexes on PCRE2: the known family patterns, compiling (UTF + UCP so \p{L} and \s
 * are Unicode-aware, MATCH_INVALID_UTF so invalid UTF-8 is skipped over instead of refused; JIT
 * when available), and splitting a list of spans into matches and the gaps between them. Bytes that
 * no alternative matches (invalid UTF-8 among them) become gap pieces, so no byte is ever lost.
 * Without PCRE2 (PP_ENGINE_ONLY builds) compiling reports PP_ERR_UNSUPPORTED. */
#include <string.h>

#include "common/utf8.h"
#include "common/alloc.h"
#include "model/tokenizer-impl.h"

#ifdef PP_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

#define LLAMA3_RE                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"      \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

const char *pp__tok_family_regex(const char *pre)
{
    static const struct {
        const char *name, *re;
    } families[] = {
        {"llama-bpe", LLAMA3_RE}, {"llama3", LLAMA3_RE}, {"llama-v3", LLAMA3_RE},
        {"qwen2", QWEN2_RE},      {"gpt2", GPT2_RE},     {"default", GPT2_RE},
    };
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
        if (strcmp(pre, families[i].name) == 0)
            return families[i].re;
    return NULL;
}

pp_status pp__spans_push(struct pp__spans *s, size_t start, size_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct pp__span *v = pp_alloc(PP_MEM_MISC, cap * sizeof(*v));
        if (!v)
            return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for %zu pieces", cap);
        if (s->n)
            memcpy(v, s->v, s->n * sizeof(*v));
        pp_free(PP_MEM_MISC, s->v);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (struct pp__span){start, len};
    return PP_OK;
}

#ifdef PP_HAVE_PCRE2

pp_status pp__tok_regex_compile(const char *pattern, size_t len, void **out)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                      &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return pp_error(PP_ERR_FORMAT,
                        "tokenizer: pre-tokenizer regex /%.*s/ does not compile at "
                        "offset %zu: %s",
                        (int)len, pattern, (size_t)off, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
    *out = re;
    return PP_OK;
}

void pp__tok_regex_free(void *re)
{
    pcre2_code_free(re);
}

static pp_status split_one(pcre2_code *re, pcre2_match_data *md, const char *text,
                           struct pp__span sp, struct pp__spans *out)
{
    const unsigned char *subj = (const unsigned char *)text + sp.start;
    size_t pos = 0, gap = 0; /* gap: start of bytes not yet handed out */
    pp_status st = PP_OK;
    while (pos < sp.len && st == PP_OK) {
        int rc = pcre2_match(re, subj, sp.len, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            /* a resource limit on a pathological input: step one character and go on */
            pos += pp_utf8_step(subj + pos, sp.len - pos);
            continue;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match: none of our patterns has one, but never loop on it */
            pos = ms + pp_utf8_step(subj + ms, sp.len - ms);
            continue;
        }
        if (ms > gap)
            st = pp__spans_push(out, sp.start + gap, ms - gap);
        if (st == PP_OK)
            st = pp__spans_push(out, sp.start + ms, me - ms);
        pos = gap = me;
    }
    if (st == PP_OK && gap < sp.len)
        st = pp__spans_push(out, sp.start + gap, sp.len - gap);
    return st;
}

pp_status pp__tok_regex_split(void *re, const char *text, const struct pp__spans *in,
                              struct pp__spans *out)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md)
        return pp_error(PP_ERR_NOMEM, "tokenizer: no memory for regex match data");
    pp_status st = PP_OK;
    for (size_t i = 0; i < in->n && st == PP_OK; i++)
        st = split_one(re, md, text, in->v[i], out);
    pcre2_match_data_free(md);
    return st;
}

#else

pp_status pp__tok_regex_compile(const char *pattern, size_t len, void **out)
{
    *out = NULL;
    return pp_error(PP_ERR_UNSUPPORTED,
                    "tokenizer: this build has no PCRE2 (built without PCRE2, "
                    "e.g. PP_ENGINE_ONLY), which byte-level BPE and regex pre-tokenizers need; "
                    "use token ids");
}

void pp__tok_regex_free(void *re)
{
    (void)re;
}

pp_status pp__tok_regex_split(void *re, const char *text, const struct pp__spans *in,
                              struct pp__spans *out)
{
    return pp_error(PP_ERR_UNSUPPORTED, "tokenizer: built without PCRE2");
}

#endif
