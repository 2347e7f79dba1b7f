/* Text ⇄ token ids, as the model's own tokenizer does it. Two families:
 *
 * - SentencePiece-style BPE (GGUF `tokenizer.ggml.model = llama`; tokenizer.json BPE with
 *   byte_fallback and the ▁ normalizer or Metaspace): spaces become ▁, one ▁ is prepended to each
 *   text segment, adjacent symbols merge by score (GGUF) or merge rank (tokenizer.json), and
 *   characters without a token fall back to <0xXX> bytes.
 * - Byte-level BPE (GGUF `gpt2` with tokenizer.ggml.merges and .pre; tokenizer.json BPE with a
 *   ByteLevel pre-tokenizer): the text is split by the family's regex (PCRE2, Unicode properties,
 *   invalid UTF-8 tolerated), each piece's bytes are mapped to the GPT-2 alphabet and merged by
 * rank.
 *
 * Special and added tokens are matched in the raw text first (leftmost, longest). Decoding gives
 * the raw bytes of each token; model/textstream.c turns streamed bytes into valid UTF-8. Loading is
 * not thread-safe; encode/decode on a loaded tokenizer are (nothing is mutated). Allocation: ids
 * and text handed out are pp_alloc(PP_MEM_MISC); the caller frees them with pp_free(PP_MEM_MISC,
 * ...). */
#ifndef PP_TOKENIZER_H
#define PP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/model.h"

struct pp_tokenizer;

enum pp_tokenizer_kind { PP_TOKENIZER_SPM = 0, PP_TOKENIZER_BPE, PP_TOKENIZER_BYTE_BPE };

/* Loads the tokenizer of an opened model. PP_ERR_NOT_FOUND (with a message) when the model carries
 * none, PP_ERR_UNSUPPORTED for a kind this build cannot run (WordPiece, Unigram, an unknown
 * pre-tokenizer family, byte-level BPE without PCRE2), PP_ERR_FORMAT for malformed metadata. */
pp_status pp_tokenizer_load(const struct pp_model *m, struct pp_tokenizer **out);
/* Loads the tokenizer alone from a .gguf file or an HF checkpoint directory (reading config.json
 * for the BOS/EOS ids), without the weights. Errors as pp_tokenizer_load. */
pp_status pp_tokenizer_open(const char *path, struct pp_tokenizer **out);
/* NULL-safe. */
void pp_tokenizer_free(struct pp_tokenizer *t);

enum pp_tokenizer_kind pp_tokenizer_kind(const struct pp_tokenizer *t);
const char *pp_tokenizer_kind_name(enum pp_tokenizer_kind k); /* "spm", "bpe", "byte-bpe" */
int32_t pp_tokenizer_vocab_size(const struct pp_tokenizer *t);
int32_t pp_tokenizer_bos(const struct pp_tokenizer *t); /* -1 when none */
int32_t pp_tokenizer_eos(const struct pp_tokenizer *t); /* -1 when none */
/* The model's setting (GGUF add_bos_token, default true for llama; tokenizer_config.json
 * add_bos_token or the post_processor's template); 0 when there is no BOS token. */
int pp_tokenizer_add_bos(const struct pp_tokenizer *t);

enum pp_tokenize_flags {
    PP_TOKENIZE_ADD_BOS = 1,       /* put BOS first (when the model has one) */
    PP_TOKENIZE_PARSE_SPECIAL = 2, /* match special/added tokens in the text */
};

/* Encodes len bytes of text (any bytes: invalid UTF-8 is tokenized, never refused). *ids is
 * allocated (at least one element) and owned by the caller. PP_ERR_INVALID_ARG for text over
 * 256 MiB. */
pp_status pp_tokenizer_encode_ex(const struct pp_tokenizer *t, const char *text, size_t len,
                                 unsigned flags, int32_t **ids, int32_t *n_ids);
/* pp_tokenizer_encode_ex with PARSE_SPECIAL, plus ADD_BOS when add_bos. */
pp_status pp_tokenizer_encode(const struct pp_tokenizer *t, const char *text, size_t len,
                              int add_bos, int32_t **ids, int32_t *n_ids);

/* The raw bytes token id stands for (▁ → space, <0xXX> → that byte, GPT-2 alphabet → bytes,
 * control/unknown/unused tokens → nothing), written to buf; returns the length (which may exceed
 * cap: then only cap bytes were written), or -1 for an id outside the vocabulary. */
int pp_tokenizer_piece(const struct pp_tokenizer *t, int32_t id, char *buf, size_t cap);

/* The bytes of ids[0..n) concatenated, with the one leading space of SentencePiece's dummy prefix
 * removed: for valid UTF-8 s, decode(encode(s)) == s in every family. *text is NUL-terminated (the
 * NUL is not counted in *len; the bytes may contain NULs and invalid UTF-8). PP_ERR_OUT_OF_RANGE
 * naming the first id outside the vocabulary. */
pp_status pp_tokenizer_decode(const struct pp_tokenizer *t, const int32_t *ids, int32_t n,
                              char **text, size_t *len);

#endif
