/* Text ⇄ token ids for SentencePiece-style vocabularies (GGUF `tokenizer.ggml.model = llama`, or an
 * HF tokenizer.json BPE model with byte fallback and the ▁ normaliser). Encoding merges the adjacent
 * pair with the best score (GGUF scores, or minus the merge rank for tokenizer.json) until none is in
 * the vocabulary; characters outside the vocabulary fall back to <0xXX> byte tokens. Byte-level BPE
 * (GGUF gpt2) is reported as unsupported for now: such models run from token ids.
 * Thread-safe for concurrent encode/decode after load. */
#ifndef PP_TOKENIZER_H
#define PP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/model.h"

struct pp_tokenizer;

/* Loads the tokenizer of an opened model. PP_ERR_NOT_FOUND (with a message) when the model carries
 * none, PP_ERR_UNSUPPORTED for a kind this build cannot run. */
pp_status pp_tokenizer_load(const struct pp_model *m, struct pp_tokenizer **out);
void pp_tokenizer_free(struct pp_tokenizer *t);

int32_t pp_tokenizer_vocab_size(const struct pp_tokenizer *t);
int32_t pp_tokenizer_bos(const struct pp_tokenizer *t); /* -1 when none */
int32_t pp_tokenizer_eos(const struct pp_tokenizer *t); /* -1 when none */
int pp_tokenizer_add_bos(const struct pp_tokenizer *t);

/* Encodes len bytes of text (BOS first when add_bos and the model has one). *ids is allocated with
 * pp_alloc(PP_MEM_MISC) and freed by the caller with pp_free(PP_MEM_MISC, ...). */
pp_status pp_tokenizer_encode(const struct pp_tokenizer *t, const char *text, size_t len,
                              int add_bos, int32_t **ids, int32_t *n_ids);

/* The bytes token id stands for (▁ → space, <0xXX> → that byte, control tokens → nothing), written
 * to buf; returns the length (which may exceed cap: then only cap bytes were written), or -1 for an
 * id outside the vocabulary. */
int pp_tokenizer_piece(const struct pp_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif
