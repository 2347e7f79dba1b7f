/* The tokenizer vocabulary of a synthetic model, trained here on a built-in text so that the
 * files need nothing from outside: a SentencePiece-style BPE vocabulary with byte fallback (the
 * default, described here), or a byte-level BPE vocabulary in the Llama 3 form (layout in
 * synth-impl.h; trained the same way on the corpus bytes, words cut as the Llama 3 regex cuts it).
 *
 * Layout: id 0 <unk> (unknown), 1 <s> (control, BOS), 2 </s> (control, EOS), 3..258 the byte
 * tokens <0x00>..<0xFF> (byte), then the single characters of the normalized corpus (spaces as
 * U+2581 and one U+2581 prepended) in UTF-8 byte order, then one token per learned merge, then
 * <extra_N> (unused) up to vocab_size.
 *
 * Training: words are the runs that start at each U+2581 (merges never cross a word start, as in
 * SentencePiece); repeatedly merge the most frequent adjacent pair over all words (counting every
 * adjacent position), ties broken by the lexicographically smallest (left, right) strings, applying
 * it left to right without overlap, until the vocabulary is full or no pair occurs twice. A merge
 * whose result is already a token is still recorded (HF needs it) but adds no token.
 *
 * Scores (what a score-driven SentencePiece tokenizer such as GGUF `llama` uses): special, byte
 * and unused tokens 0; the token made by merge rank m (0-based) scores -(m + 1), so an earlier
 * merge always wins; single characters come after all merges, -(n_merges + 1 + c) for the c-th
 * character, as SentencePiece lays them out. Rank order of the HF merges and score order agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "model/synth-impl.h"

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */

static const char corpus[] =
    "The old lighthouse stood at the end of a narrow road, where the land gave way to rocks "
    "and the rocks gave way to the sea. At dusk the keeper climbed the stairs and lit the "
    "lamp before the sun had fully set. She did not need to count the steps any more, but "
    "she counted them anyway, because the counting kept her mind quiet and her breath even. "

    "In the spring the fishing boats came back from the south, and the harbour filled with "
    "voices, nets and the smell of tar. The children of the village ran along the wall to "
    "watch them arrive. They knew each boat by the colour of its sail and each captain by "
    "the way he stood at the wheel. When the last boat was tied up, the whole village seemed "
    "to let out a long breath. "

    "A good map is a kind of promise. It says that the river will bend where the line bends, "
    "that the bridge will be there when you reach it, and that the hill you see from the "
    "valley is the same hill you will climb in the morning. In most places the promise is "
    "kept. Where it is not, a traveller learns to read the land itself, the slope of the "
    "fields, the colour of the grass near water, the direction in which the trees lean. "

    "The baker on the corner opened his shop before dawn. It was the quiet hour he liked "
    "best, when the ovens were warming and the street was still dark. Well before the first "
    "customers arrived, the shelves were full of bread, and the windows were white with "
    "steam. The baker never wrote down his recipes, and when people asked him how he knew "
    "the dough was ready, he only said that it told him so. "

    "A new language is slow to learn at first and then suddenly fast. In the first weeks the "
    "words seem to slide away as soon as you look at them. Then one day you notice that you "
    "understood a whole sentence without thinking, and after that the sentences keep coming, "
    "one after another, like stones that fall into place across a stream. "

    "In winter the library was the warmest room in the town. Townsfolk came to read the "
    "newspapers, to write letters, or simply to sit near the radiator and watch the snow "
    "fall past the tall windows. The librarian knew which reader wanted which chair, and she "
    "kept the heavy books on the lower shelves so that nobody had to climb a ladder in the "
    "cold. "

    "The jazz quartet that played at the harbour inn every summer was a mixed and lively "
    "group. The pianist joked with the crowd, the drummer kept an exact and patient beat, "
    "and the old saxophone player, who had been a sailor in his youth, closed each night "
    "with a slow tune that made even the dozing dogs by the door lift their heads.";

const char *pp__synth_corpus(void)
{
    return corpus;
}

/* Bytes in the UTF-8 sequence that starts with lead byte c (1 for stray continuation bytes). */
static int utf8_len(unsigned char c)
{
    return c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

/* The corpus with spaces as U+2581 and one prepended. */
static char *normalize(void)
{
    size_t n = strlen(corpus), spaces = 0;
    for (size_t i = 0; i < n; i++)
        spaces += corpus[i] == ' ';
    char *out = pp_alloc(PP_MEM_MISC, n + 2 * spaces + 4);
    if (!out)
        return NULL;
    char *p = out;
    memcpy(p, SPACE_MARK, 3);
    p += 3;
    for (size_t i = 0; i < n; i++) {
        if (corpus[i] == ' ') {
            memcpy(p, SPACE_MARK, 3);
            p += 3;
        } else {
            *p++ = corpus[i];
        }
    }
    *p = '\0';
    return out;
}

struct trainer {
    struct pp__synth_vocab *v;
    int32_t first;    /* the first id a merge may produce or match */
    int32_t n_tokens; /* tokens defined so far */
    int32_t *seq;     /* the corpus as token ids, -1 before each word */
    int64_t seq_len;
    uint64_t *pairs; /* scratch: (left << 32 | right) of each adjacent pair */
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int32_t find_token(const struct trainer *t, const char *s)
{
    for (int32_t i = t->first; i < t->n_tokens; i++)
        if (strcmp(t->v->tokens[i], s) == 0)
            return i;
    return -1;
}

static pp_status add_token(struct trainer *t, char *s, int32_t type)
{
    if (!s)
        return pp_error(PP_ERR_NOMEM, "synth vocab: no memory for token %d", t->n_tokens);
    t->v->tokens[t->n_tokens] = s;
    t->v->types[t->n_tokens] = type;
    t->v->scores[t->n_tokens] = 0.0f;
    t->n_tokens++;
    return PP_OK;
}

static int cmp_char(const char *a, int la, const char *b, int lb)
{
    int c = memcmp(a, b, (size_t)(la < lb ? la : lb));
    return c ? c : la - lb;
}

/* Single characters of the normalized text, sorted by their UTF-8 bytes; then the text as ids. */
static pp_status add_chars(struct trainer *t, const char *text)
{
    enum { MAX_CHARS = 300 - PP__VOCAB_FIRST_CHAR };
    size_t n = strlen(text);
    const char *uniq[MAX_CHARS];
    int uniq_len[MAX_CHARS], n_uniq = 0;
    for (size_t i = 0; i < n; i += (size_t)utf8_len((unsigned char)text[i])) {
        int len = utf8_len((unsigned char)text[i]), k = 0;
        while (k < n_uniq && cmp_char(uniq[k], uniq_len[k], text + i, len) < 0)
            k++;
        if (k < n_uniq && cmp_char(uniq[k], uniq_len[k], text + i, len) == 0)
            continue;
        if (n_uniq == MAX_CHARS)
            return pp_error(PP_ERR_INTERNAL,
                            "synth vocab: the corpus has more than %d "
                            "characters, too many for a 300-token vocabulary",
                            MAX_CHARS);
        memmove(uniq + k + 1, uniq + k, (size_t)(n_uniq - k) * sizeof(*uniq));
        memmove(uniq_len + k + 1, uniq_len + k, (size_t)(n_uniq - k) * sizeof(*uniq_len));
        uniq[k] = text + i;
        uniq_len[k] = len;
        n_uniq++;
    }
    for (int k = 0; k < n_uniq; k++) {
        pp_status st =
            add_token(t, pp_strndup(PP_MEM_MISC, uniq[k], (size_t)uniq_len[k]), PP__TOK_NORMAL);
        if (st)
            return st;
    }
    t->v->n_chars = n_uniq;

    int64_t j = 0;
    for (size_t i = 0; i < n; i += (size_t)utf8_len((unsigned char)text[i])) {
        char c[5] = {0};
        memcpy(c, text + i, (size_t)utf8_len((unsigned char)text[i]));
        if (strcmp(c, SPACE_MARK) == 0)
            t->seq[j++] = -1; /* a word starts here: no pair spans this point */
        t->seq[j++] = find_token(t, c);
    }
    t->seq_len = j;
    return PP_OK;
}

/* The most frequent adjacent pair (ties: smallest strings); returns its count. */
static int64_t best_pair(struct trainer *t, int32_t *left, int32_t *right)
{
    int64_t n = 0;
    for (int64_t i = 0; i + 1 < t->seq_len; i++)
        if (t->seq[i] >= 0 && t->seq[i + 1] >= 0)
            t->pairs[n++] = (uint64_t)t->seq[i] << 32 | (uint32_t)t->seq[i + 1];
    qsort(t->pairs, (size_t)n, sizeof(*t->pairs), cmp_u64);
    int64_t best = 0;
    for (int64_t i = 0, j; i < n; i = j) {
        for (j = i; j < n && t->pairs[j] == t->pairs[i]; j++)
            ;
        int32_t a = (int32_t)(t->pairs[i] >> 32), b = (int32_t)(uint32_t)t->pairs[i];
        int better = j - i > best;
        if (j - i == best) {
            int c = strcmp(t->v->tokens[a], t->v->tokens[*left]);
            better = c < 0 || (c == 0 && strcmp(t->v->tokens[b], t->v->tokens[*right]) < 0);
        }
        if (better) {
            best = j - i;
            *left = a;
            *right = b;
        }
    }
    return best;
}

static void apply_merge(struct trainer *t, int32_t a, int32_t b, int32_t merged)
{
    int64_t out = 0;
    for (int64_t i = 0; i < t->seq_len; i++) {
        if (i + 1 < t->seq_len && t->seq[i] == a && t->seq[i + 1] == b) {
            t->seq[out++] = merged;
            i++;
        } else {
            t->seq[out++] = t->seq[i];
        }
    }
    t->seq_len = out;
}

static pp_status train(struct trainer *t, int32_t vocab_size)
{
    struct pp__synth_vocab *v = t->v;
    int32_t a = 0, b = 0;
    while (t->n_tokens < vocab_size && best_pair(t, &a, &b) >= 2) {
        size_t la = strlen(v->tokens[a]), lb = strlen(v->tokens[b]);
        char *s = pp_alloc(PP_MEM_MISC, la + lb + 1);
        if (!s)
            return pp_error(PP_ERR_NOMEM, "synth vocab: no memory for merge %d", v->n_merges);
        memcpy(s, v->tokens[a], la);
        memcpy(s + la, v->tokens[b], lb + 1);
        int32_t id = find_token(t, s);
        int32_t rank = v->n_merges;
        v->merges[2 * rank] = a;
        v->merges[2 * rank + 1] = b;
        v->n_merges++;
        if (id < 0) {
            id = t->n_tokens;
            add_token(t, s, PP__TOK_NORMAL);
            v->scores[id] = -(float)(rank + 1);
        } else {
            pp_free(PP_MEM_MISC, s);
        }
        apply_merge(t, a, b, id);
    }
    return PP_OK;
}

static pp_status add_fixed(struct trainer *t)
{
    static const char *const specials[3] = {"<unk>", "<s>", "</s>"};
    static const int32_t special_types[3] = {PP__TOK_UNKNOWN, PP__TOK_CONTROL, PP__TOK_CONTROL};
    pp_status st;
    for (int i = 0; i < 3; i++)
        if ((st = add_token(t, pp_strdup(PP_MEM_MISC, specials[i]), special_types[i])))
            return st;
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", i);
        if ((st = add_token(t, pp_strdup(PP_MEM_MISC, name), PP__TOK_BYTE)))
            return st;
    }
    return PP_OK;
}

static pp_status add_extras(struct trainer *t, int32_t vocab_size)
{
    for (int32_t k = 0; t->n_tokens < vocab_size; k++) {
        char name[32];
        snprintf(name, sizeof(name), "<extra_%d>", k);
        pp_status st = add_token(t, pp_strdup(PP_MEM_MISC, name), PP__TOK_UNUSED);
        if (st)
            return st;
    }
    return PP_OK;
}

static pp_status build(struct trainer *t, int32_t vocab_size, const char *text)
{
    pp_status st;
    if ((st = add_fixed(t)) || (st = add_chars(t, text)) || (st = train(t, vocab_size)))
        return st;
    for (int32_t c = 0; c < t->v->n_chars; c++)
        t->v->scores[PP__VOCAB_FIRST_CHAR + c] = -(float)(t->v->n_merges + 1 + c);
    return add_extras(t, vocab_size);
}

/* ---- byte-level BPE ---- */

/* Byte b in the GPT-2 alphabet (see model/tokenizer_bytemap.c; repeated here so the writer does
 * not depend on the reader). */
static void byte_char(unsigned b, char out[3])
{
    unsigned cp = b <= 0x20 ? 256 + b : (b >= 0x7f && b <= 0xa0) ? 289 + (b - 0x7f)
                  : b == 0xad ? 323 : b;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

static int is_letter(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* The corpus as byte ids with a -1 before each word, words cut as the Llama 3 pre-tokenizer cuts
 * this ASCII text: [one non-letter]? letters | " "? punctuation | spaces. */
static void bpe_words(struct trainer *t)
{
    const char *c = corpus;
    size_t n = strlen(c);
    int64_t j = 0;
    for (size_t i = 0; i < n;) {
        size_t e = i;
        if (is_letter(c[e]) || (e + 1 < n && c[e] != '\n' && is_letter(c[e + 1]))) {
            e += !is_letter(c[e]);
            while (e < n && is_letter(c[e]))
                e++;
        } else if (c[e] != ' ' || (e + 1 < n && c[e + 1] != ' ')) {
            e += c[e] == ' ';
            while (e < n && c[e] != ' ' && !is_letter(c[e]))
                e++;
        } else {
            while (e < n && c[e] == ' ')
                e++;
        }
        t->seq[j++] = -1;
        for (; i < e; i++)
            t->seq[j++] = (uint8_t)c[i];
    }
    t->seq_len = j;
}

static pp_status build_bpe(struct trainer *t, int32_t vocab_size)
{
    pp_status st;
    for (unsigned b = 0; b < 256; b++) {
        char ch[3];
        byte_char(b, ch);
        if ((st = add_token(t, pp_strdup(PP_MEM_MISC, ch), PP__TOK_NORMAL)))
            return st;
    }
    if ((st = add_token(t, pp_strdup(PP_MEM_MISC, "<|begin_of_text|>"), PP__TOK_CONTROL)) ||
        (st = add_token(t, pp_strdup(PP_MEM_MISC, "<|end_of_text|>"), PP__TOK_CONTROL)))
        return st;
    bpe_words(t);
    if ((st = train(t, vocab_size)))
        return st;
    for (int32_t k = 0; t->n_tokens < vocab_size; k++) {
        char name[48];
        snprintf(name, sizeof(name), "<|reserved_special_token_%d|>", k);
        if ((st = add_token(t, pp_strdup(PP_MEM_MISC, name), PP__TOK_CONTROL)))
            return st;
    }
    return PP_OK;
}

void pp__synth_vocab_specials(enum pp_synth_tokenizer kind, int32_t *bos, int32_t *eos)
{
    *bos = kind == PP_SYNTH_TOKENIZER_BPE ? 256 : 1;
    *eos = kind == PP_SYNTH_TOKENIZER_BPE ? 257 : 2;
}

pp_status pp__synth_vocab_build(int32_t vocab_size, struct pp__synth_vocab *v)
{
    return pp__synth_vocab_build_kind(PP_SYNTH_TOKENIZER_SPM, vocab_size, v);
}

pp_status pp__synth_vocab_build_kind(enum pp_synth_tokenizer kind, int32_t vocab_size,
                                     struct pp__synth_vocab *v)
{
    memset(v, 0, sizeof(*v));
    if (vocab_size < 300)
        return pp_error(PP_ERR_INVALID_ARG, "synth vocab: vocab_size: expected >= 300, got %d",
                        vocab_size);
    char *text = normalize();
    size_t text_len = text ? strlen(text) : 0;
    struct trainer t = {.v = v, .first = PP__VOCAB_FIRST_CHAR};
    v->n = vocab_size;
    v->byte_level = kind == PP_SYNTH_TOKENIZER_BPE;
    if (v->byte_level)
        t.first = 0;
    pp__synth_vocab_specials(kind, &v->bos, &v->eos);
    v->tokens = pp_calloc(PP_MEM_MISC, (size_t)vocab_size, sizeof(*v->tokens));
    v->scores = pp_calloc(PP_MEM_MISC, (size_t)vocab_size, sizeof(*v->scores));
    v->types = pp_calloc(PP_MEM_MISC, (size_t)vocab_size, sizeof(*v->types));
    /* a merge needs a pair seen twice, so there are fewer merges than characters */
    v->merges = pp_calloc(PP_MEM_MISC, text_len + 1, 2 * sizeof(*v->merges));
    t.seq = pp_calloc(PP_MEM_MISC, 2 * text_len + 1, sizeof(*t.seq));
    t.pairs = pp_calloc(PP_MEM_MISC, 2 * text_len + 1, sizeof(*t.pairs));
    pp_status st;
    if (!text || !v->tokens || !v->scores || !v->types || !v->merges || !t.seq || !t.pairs)
        st = pp_error(PP_ERR_NOMEM, "synth vocab: no memory for %d tokens", vocab_size);
    else if (v->byte_level)
        st = build_bpe(&t, vocab_size);
    else
        st = build(&t, vocab_size, text);
    pp_free(PP_MEM_MISC, t.pairs);
    pp_free(PP_MEM_MISC, t.seq);
    pp_free(PP_MEM_MISC, text);
    if (st)
        pp__synth_vocab_free(v);
    return st;
}

void pp__synth_vocab_free(struct pp__synth_vocab *v)
{
    if (!v)
        return;
    if (v->tokens)
        for (int32_t i = 0; i < v->n; i++)
            pp_free(PP_MEM_MISC, v->tokens[i]);
    pp_free(PP_MEM_MISC, v->tokens);
    pp_free(PP_MEM_MISC, v->scores);
    pp_free(PP_MEM_MISC, v->types);
    pp_free(PP_MEM_MISC, v->merges);
    memset(v, 0, sizeof(*v));
}
