/* Internals of the tokenizer module (model/tokenizer*.c): the vocabulary tables, the text pipeline
 * (special-token split → normalizer → pre-tokenizer → merges) and the loaders that fill them. Not a
 * public interface: only the tokenizer files and their unit test include it.
 *
 * One struct serves every family; the loaders translate their format into these knobs:
 *   GGUF llama      merge_by_score, normalizer [prepend ▁, " "→▁], byte fallback, meta decode
 *   GGUF gpt2       merge by rank, byte_level, one Split step with the family regex
 *   tokenizer.json  whatever its normalizer / pre_tokenizer / model say (see tokenizer_json.c) */
#ifndef PP_TOKENIZER_IMPL_H
#define PP_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/status.h"
#include "model/tokenizer.h"

/* Token types as GGUF numbers them (tokenizer.ggml.token_type). */
enum pp__tok_type {
    PP__TT_NORMAL = 1,
    PP__TT_UNKNOWN = 2,
    PP__TT_CONTROL = 3,
    PP__TT_USER = 4,
    PP__TT_UNUSED = 5,
    PP__TT_BYTE = 6,
};

#define PP__META "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */

/* ---- normalizer: applied to every text segment between special tokens ---- */
enum pp__norm_kind { PP__NORM_PREPEND, PP__NORM_REPLACE };
struct pp__norm_op {
    enum pp__norm_kind kind;
    char *a; /* PREPEND: the prefix; REPLACE: the literal pattern (non-empty) */
    char *b; /* REPLACE: the replacement */
};

/* ---- pre-tokenizer steps, applied in order to the pieces of a segment ---- */
enum pp__pre_kind {
    PP__PRE_SPLIT,     /* regex matches and the gaps between them become pieces (Isolated) */
    PP__PRE_METASPACE, /* " " → replacement, optional prefix, optional split before each one */
    PP__PRE_PREFIX,    /* ByteLevel add_prefix_space: one " " before a piece not starting so */
};
enum pp__prepend { PP__PREPEND_NEVER, PP__PREPEND_FIRST, PP__PREPEND_ALWAYS };
struct pp__pre_step {
    enum pp__pre_kind kind;
    void *re;          /* SPLIT: pcre2_code_8 (opaque here so only tokenizer_pretok.c sees PCRE2) */
    char *replacement; /* METASPACE */
    enum pp__prepend prepend;
    int split; /* METASPACE */
};
#define PP__MAX_NORM 8
#define PP__MAX_PRE 8

struct pp__merge_slot {
    int32_t left, right; /* -1 left: empty */
    int32_t rank, result;
};

struct pp_tokenizer {
    enum pp_tokenizer_kind kind;
    int32_t n;
    char **piece;         /* [n] NUL-terminated (NUL bytes inside are allowed: use len) */
    int32_t *len;         /* [n] */
    float *score;         /* [n] */
    uint8_t *type;        /* [n] enum pp__tok_type */
    int32_t byte_id[256]; /* <0xXX> tokens, -1 when absent */
    int32_t *hash;        /* [hash_cap] ids by piece, -1 empty */
    int64_t hash_cap;
    struct pp__merge_slot *merges; /* [merge_cap] open addressing on (left, right) */
    int64_t merge_cap, n_merges;

    int32_t bos, eos, unk;
    int add_bos;

    int merge_by_score; /* SentencePiece: best score wins; else lowest merge rank */
    int byte_level;     /* pieces are mapped to the GPT-2 byte alphabet before merging */
    int byte_fallback;  /* a symbol without a token becomes its <0xXX> bytes */
    int ignore_merges;  /* a piece that is itself a token is emitted whole */
    int meta_decode;    /* decoding turns ▁ into a space */
    int strip_space;    /* decoding drops one leading space (the dummy prefix) */
    int split_at_meta;  /* no token holds ▁ after another character: the text can be cut before
                           every such ▁ without changing the result (see tokenizer.c) */

    int n_norm;
    struct pp__norm_op norm[PP__MAX_NORM];
    int n_pre;
    struct pp__pre_step pre[PP__MAX_PRE];

    /* special and added tokens matched in the raw text (leftmost, longest): a hash of their
     * pieces, and per first byte the distinct lengths to try, longest first */
    int32_t *special; /* [n_special] ids */
    int32_t n_special;
    int32_t *special_hash; /* [special_cap] ids, -1 empty */
    int64_t special_cap;
    int32_t *special_len; /* distinct lengths, grouped by first byte */
    int32_t len_at[257];  /* special_len[len_at[c] .. len_at[c+1]) for first byte c */
};

/* ---- vocabulary (tokenizer_vocab.c) ---- */

/* Allocates the tables for n tokens (types 0, scores 0, no pieces yet). */
pp_status pp__tok_vocab_alloc(struct pp_tokenizer *t, int32_t n);
/* Sets the piece of id (copied); the first id of a duplicated piece keeps the lookup. <0xXX>
 * pieces of byte or normal type register as byte tokens. */
pp_status pp__tok_set_piece(struct pp_tokenizer *t, int32_t id, const char *s, size_t n);
/* Gives every id without a piece an empty one (unreachable by lookup). */
pp_status pp__tok_fill_missing(struct pp_tokenizer *t);
/* Id of the token whose piece is s[0..n), or -1. */
int32_t pp__tok_lookup(const struct pp_tokenizer *t, const char *s, size_t n);
/* Merge table: sized for n merges, then (left, right) → (rank, result); the first rank wins. */
pp_status pp__tok_merges_alloc(struct pp_tokenizer *t, int64_t n);
void pp__tok_merge_add(struct pp_tokenizer *t, int32_t left, int32_t right, int32_t rank,
                       int32_t result);
/* Adds merge "a b" given as the two piece strings; ignored (returns 0) when a, b or a+b is not a
 * token. Returns 1 when added. */
int pp__tok_merge_add_str(struct pp_tokenizer *t, const char *a, size_t la, const char *b,
                          size_t lb, int32_t rank);
const struct pp__merge_slot *pp__tok_merge_find(const struct pp_tokenizer *t, int32_t left,
                                                int32_t right);
/* Builds the special-token index from every id whose type is CONTROL, USER or UNKNOWN (non-empty
 * pieces only). */
pp_status pp__tok_specials_build(struct pp_tokenizer *t);
/* The special token that starts at text[i] (the longest), or -1. */
int32_t pp__tok_special_match(const struct pp_tokenizer *t, const char *text, size_t i, size_t len);

/* ---- byte-level alphabet (tokenizer_bytemap.c) ---- */

/* Appends the GPT-2 alphabet character of byte b (1 or 2 UTF-8 bytes) to out; returns its length.
 */
size_t pp__tok_byte_to_char(uint8_t b, char out[2]);
/* The byte that the alphabet character (code point cp) stands for, or -1 if none. */
int pp__tok_char_to_byte(uint32_t cp);

/* ---- pre-tokenizer regexes (tokenizer_pretok.c) ---- */

/* The regex of a GGUF tokenizer.ggml.pre family ("llama-bpe", "llama3", "qwen2", "gpt2",
 * "default"), or NULL when unknown. */
const char *pp__tok_family_regex(const char *pre);
/* Compiles pattern (UTF, UCP, invalid UTF-8 tolerated). PP_ERR_UNSUPPORTED in a build without
 * PCRE2, PP_ERR_FORMAT with the PCRE2 message for a bad pattern. */
pp_status pp__tok_regex_compile(const char *pattern, size_t len, void **out);
void pp__tok_regex_free(void *re);

/* A piece of the segment being encoded: [start, start+len) of the segment buffer. */
struct pp__span {
    size_t start, len;
};
struct pp__spans {
    struct pp__span *v;
    size_t n, cap;
};
pp_status pp__spans_push(struct pp__spans *s, size_t start, size_t len);
/* Splits every span of in by re: matches and the gaps between them, in order, into out. */
pp_status pp__tok_regex_split(void *re, const char *text, const struct pp__spans *in,
                              struct pp__spans *out);

/* ---- merging (tokenizer_merge.c) ---- */

/* Scratch reused across the pieces of one encode call. */
struct pp__merge_scratch {
    struct pp__merge_sym *sym;
    size_t sym_cap;
    struct pp__merge_cand *heap;
    size_t heap_cap;
    char *mapped; /* byte-level: the piece in the GPT-2 alphabet */
    size_t mapped_cap;
};
void pp__merge_scratch_free(struct pp__merge_scratch *s);
/* Encodes one pre-tokenized piece and appends its ids to out (an int32 array in a pp_buf). */
pp_status pp__tok_encode_piece(const struct pp_tokenizer *t, const char *p, size_t n,
                               struct pp__merge_scratch *s, struct pp_buf *out);

/* ---- loaders ---- */

struct pp_gguf;
/* tokenizer_gguf.c: fills t from the tokenizer.ggml.* keys of g. */
pp_status pp__tok_load_gguf(struct pp_tokenizer *t, const struct pp_gguf *g, const char *path);
/* tokenizer_json.c: fills t from dir/tokenizer.json (+ tokenizer_config.json). bos and eos are the
 * model's ids (-1 unknown); config.json is read for them when both are -1 and read_config. */
pp_status pp__tok_load_json(struct pp_tokenizer *t, const char *dir, int32_t bos, int32_t eos,
                            int read_config);

#endif
