/* Internals of the synthetic model writer (model/synth*.c, model/gguf_write.c,
 * model/safetensors_write.c): the canonical tensor table, the deterministic weight values, the
 * tokenizer vocabulary, and the small output helpers (atomic file, byte/JSON buffer, GGUF and
 * safetensors writers). Not a public interface: only the synth module and its unit test include it.
 */
#ifndef PP_SYNTH_IMPL_H
#define PP_SYNTH_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "common/buf.h"
#include "kernels/dtype.h"
#include "model/synth.h"

/* ---- spec (synth.c) ---- */

enum pp__synth_arch {
    PP__SYNTH_LLAMA = 0,
    PP__SYNTH_MISTRAL,
    PP__SYNTH_QWEN2,
    PP__SYNTH_MIXTRAL,
    PP__SYNTH_QWEN2MOE
};

/* A spec with the arch defaults applied and head_dim filled in. */
struct pp__synth_model {
    struct pp_synth_spec s; /* resolved: qkv_bias 0/1, rope_theta, norm_eps, head_dim set, and
                               expert_ffn_dim, shared_ffn_dim set for MoE */
    enum pp__synth_arch arch;
    int moe;         /* mixtral or qwen2moe */
    int gguf_llama;  /* GGUF architecture llama: q/k rows permuted */
};

/* Validates s and fills *m; PP_ERR_INVALID_ARG with a message otherwise. */
pp_status pp__synth_resolve(const struct pp_synth_spec *s, struct pp__synth_model *m);

/* ---- tensor table (synth_tensors.c) ---- */

enum pp__synth_kind {
    PP__SYNTH_EMBED,  /* token embedding: uniform +-1 */
    PP__SYNTH_LINEAR, /* [out, in] weight: uniform +-sqrt(3/in) */
    PP__SYNTH_NORM,   /* RMSNorm weight: 1 + uniform +-0.2 */
    PP__SYNTH_BIAS,   /* q/k/v bias: uniform +-0.1 */
    PP__SYNTH_GATE,   /* a [n] gate vector dotted with the hidden state: uniform +-sqrt(3/n) */
};

struct pp__synth_tensor {
    char hf_name[96]; /* canonical name, also the hash key of the values */
    char gguf_name[64];
    enum pp__synth_kind kind;
    int n_dims;         /* 1 or 2 */
    int64_t shape[2];   /* numpy order: [rows, cols] or [n] */
    int32_t perm_heads; /* GGUF llama: rows (or elements) permuted in this many heads; 0 = none */
    int32_t expert;     /* -1, or the expert of an [n_experts, rows, cols] GGUF tensor (gguf_name)
                           that this HF tensor is; experts of one role follow each other */
    int32_t n_experts;  /* experts in that GGUF tensor */
    int hf_row;         /* 1-D here and in GGUF, [1, n] in HF */
};

/* Number of tensors of the model in the HF layout (GGUF has one 3-D tensor per expert role where
 * HF has one per expert, and rope_freqs.weight). */
int64_t pp__synth_tensor_count(const struct pp__synth_model *m);
/* The i-th tensor in file order: embedding, then per layer, then final norm, then lm head. */
void pp__synth_tensor_get(const struct pp__synth_model *m, int64_t i, struct pp__synth_tensor *t);
/* Elements in the tensor. */
int64_t pp__synth_tensor_numel(const struct pp__synth_tensor *t);
/* The HF row (or element, for 1-D) that GGUF row r holds, for a tensor permuted in n_heads heads
 * of rows/n_heads rows each: the inverse of w.reshape(n, 2, d/2, c).swapaxes(1, 2). */
int64_t pp__synth_gguf_row_to_hf(int64_t r, int32_t n_heads, int64_t rows);
/* The llama3 per-frequency divisors (head_dim/2 values) for rope_freqs.weight. */
void pp__synth_rope_freqs(const struct pp__synth_model *m, float *out);

/* ---- weight values (synth_weights.c) ---- */

/* Raw f32 values of elements [first, first+n) of a tensor (flat index in the HF layout), before
 * any rounding to the dtype. */
void pp__synth_values(uint64_t seed, const struct pp__synth_tensor *t, int64_t first, int64_t n,
                      float *out);

/* Storage type of a tensor: GGUF keeps 1-D tensors in F32 and the rest in the model dtype; HF keeps
 * everything in the model dtype except Q8_0, stored as F32. */
enum pp_dtype pp__synth_store_type(const struct pp__synth_model *m,
                                   const struct pp__synth_tensor *t, int gguf);

/* Encodes n raw values (one row of a matrix, or a whole 1-D tensor) as type store, so that the f32
 * value of every stored element is the canonical one: the raw value rounded to the model dtype
 * (Q8_0 rows of matrices quantized, then dequantized when stored as F32). dst gets
 * pp_dtype_row_bytes(store, n) bytes; scratch holds n floats. */
void pp__synth_encode(const float *raw, int64_t n, enum pp_dtype model_dtype, int matrix,
                      enum pp_dtype store, void *dst, float *scratch);

/* Receives a tensor's bytes in order, in pieces. */
typedef pp_status (*pp__synth_sink)(void *ctx, const void *data, uint64_t n);

/* Generates tensor t in the GGUF (gguf != 0) or HF layout and storage type and hands its bytes to
 * sink in pieces of a few MiB. */
pp_status pp__synth_emit(const struct pp__synth_model *m, const struct pp__synth_tensor *t,
                         int gguf, pp__synth_sink sink, void *ctx);

/* ---- tokenizer vocabulary (synth_vocab.c) ---- */

enum pp__token_type {
    PP__TOK_NORMAL = 1,
    PP__TOK_UNKNOWN = 2,
    PP__TOK_CONTROL = 3,
    PP__TOK_UNUSED = 5,
    PP__TOK_BYTE = 6,
};

struct pp__synth_vocab {
    int32_t n;        /* = vocab_size */
    int byte_level;   /* PP_SYNTH_TOKENIZER_BPE: tokens are in the GPT-2 byte alphabet */
    int32_t bos, eos; /* special token ids */
    char **tokens;    /* [n] UTF-8 strings (spaces shown as U+2581) */
    float *scores;    /* [n] */
    int32_t *types;   /* [n] enum pp__token_type */
    int32_t n_chars;  /* single-character tokens, ids 259 .. 259+n_chars-1 */
    int32_t n_merges; /* learned merges, in rank order */
    int32_t *merges;  /* [n_merges][2] left and right token ids */
};

#define PP__VOCAB_FIRST_CHAR 259 /* 3 specials + 256 bytes */

/* The built-in training text (plain ASCII, single spaces, no newlines). */
const char *pp__synth_corpus(void);
/* Builds the vocabulary of vocab_size tokens (>= 300). Caller frees with pp__synth_vocab_free. */
pp_status pp__synth_vocab_build(int32_t vocab_size, struct pp__synth_vocab *v);
/* The vocabulary of the given kind. Byte-level BPE layout: ids 0..255 the bytes (GPT-2 alphabet,
 * byte order), 256 <|begin_of_text|>, 257 <|end_of_text|> (control), then one token per learned
 * merge (words split as the Llama 3 regex splits the corpus), then <|reserved_special_token_N|>
 * (control) up to vocab_size. */
pp_status pp__synth_vocab_build_kind(enum pp_synth_tokenizer kind, int32_t vocab_size,
                                     struct pp__synth_vocab *v);
/* BOS and EOS ids of a kind's vocabulary. */
void pp__synth_vocab_specials(enum pp_synth_tokenizer kind, int32_t *bos, int32_t *eos);
/* NULL-safe, safe on a half-built vocabulary. */
void pp__synth_vocab_free(struct pp__synth_vocab *v);

/* ---- byte / JSON buffer (synth_json.c) ---- */

/* A growable byte buffer; an allocation failure is sticky (failed = 1) and later appends do
 * nothing, so builders check once at the end. */
/* A JSON string literal (escaped by pp_buf_json_string). */
void pp__synth_json_cstr(struct pp_buf *b, const char *s);
/* A JSON number for a float: the shortest decimal that reads back as the same float, with ".0"
 * added to integral values so readers see a float. */
void pp__synth_json_float(struct pp_buf *b, float v);

/* ---- atomic output file (synth_file.c) ---- */

/* Writes go to "<path>.tmp.<pid>", renamed over path by pp__out_commit; pp__out_abort removes it.
 * Errors are reported with the path and the errno text. */
struct pp__out_file {
    FILE *f;
    char path[4096];
    char tmp[4096 + 32];
    uint64_t pos; /* bytes written so far */
};

pp_status pp__out_open(struct pp__out_file *o, const char *path);
pp_status pp__out_write(struct pp__out_file *o, const void *data, uint64_t n);
/* Writes zero bytes up to the next multiple of align. */
pp_status pp__out_pad(struct pp__out_file *o, uint64_t align, char fill);
pp_status pp__out_commit(struct pp__out_file *o);
/* Safe on an unopened (zeroed) or already committed file. */
void pp__out_abort(struct pp__out_file *o);
/* Writes a whole small file atomically. */
pp_status pp__out_write_file(const char *path, const void *data, uint64_t n);

/* ---- GGUF writer (gguf_write.c) ---- */

enum pp__gguf_type {
    PP__GGUF_U32 = 4,
    PP__GGUF_I32 = 5,
    PP__GGUF_F32 = 6,
    PP__GGUF_BOOL = 7,
    PP__GGUF_STRING = 8,
    PP__GGUF_ARRAY = 9,
    PP__GGUF_U64 = 10,
};

#define PP__GGUF_ALIGN 32

struct pp__gguf_tensor_info {
    uint64_t nbytes, offset; /* offset from the start of the data section */
};

/* Usage: init; add metadata and tensor infos; begin (writes the header); then the bytes of every
 * tensor in the order they were added, in any number of pieces; finish. free always. */
struct pp__gguf_writer {
    struct pp_buf kv;    /* serialized key/value pairs */
    struct pp_buf infos; /* serialized tensor infos */
    uint64_t n_kv, n_tensors;
    struct pp__gguf_tensor_info *tensors;
    uint64_t cap, data_size;
    uint64_t cur, cur_done; /* streaming: tensor being written, its bytes so far */
    uint64_t data_start;    /* file offset of the data section */
    struct pp__out_file out;
    int nomem;
};

void pp__gguf_init(struct pp__gguf_writer *w);
void pp__gguf_add_u32(struct pp__gguf_writer *w, const char *key, uint32_t v);
void pp__gguf_add_i32(struct pp__gguf_writer *w, const char *key, int32_t v);
void pp__gguf_add_u64(struct pp__gguf_writer *w, const char *key, uint64_t v);
void pp__gguf_add_f32(struct pp__gguf_writer *w, const char *key, float v);
void pp__gguf_add_bool(struct pp__gguf_writer *w, const char *key, int v);
void pp__gguf_add_str(struct pp__gguf_writer *w, const char *key, const char *v);
void pp__gguf_add_str_array(struct pp__gguf_writer *w, const char *key, const char *const *v,
                            uint64_t n);
void pp__gguf_add_f32_array(struct pp__gguf_writer *w, const char *key, const float *v, uint64_t n);
void pp__gguf_add_i32_array(struct pp__gguf_writer *w, const char *key, const int32_t *v,
                            uint64_t n);
/* shape in numpy order (the file gets it reversed); type F32/F16/BF16/Q8_0. */
pp_status pp__gguf_add_tensor(struct pp__gguf_writer *w, const char *name, int n_dims,
                              const int64_t *shape, enum pp_dtype type);
pp_status pp__gguf_begin(struct pp__gguf_writer *w, const char *path);
pp_status pp__gguf_write(struct pp__gguf_writer *w, const void *data, uint64_t n);
pp_status pp__gguf_finish(struct pp__gguf_writer *w);
void pp__gguf_free(struct pp__gguf_writer *w);
/* The ggml type number of a dtype. */
uint32_t pp__gguf_ggml_type(enum pp_dtype t);

/* ---- safetensors writer (safetensors_write.c) ---- */

struct pp__st_entry {
    char name[96];
    enum pp_dtype type;
    int n_dims;
    int64_t shape[2];
    uint64_t nbytes;
};

/* Usage as the GGUF writer: init; add; begin; write every tensor's bytes in order; finish; free. */
struct pp__st_writer {
    struct pp__st_entry *entries;
    uint64_t n, cap, data_size;
    uint64_t cur, cur_done;
    struct pp__out_file out;
};

void pp__st_init(struct pp__st_writer *w);
/* type F32/F16/BF16 (safetensors has no Q8_0). */
pp_status pp__st_add(struct pp__st_writer *w, const char *name, enum pp_dtype type, int n_dims,
                     const int64_t *shape);
pp_status pp__st_begin(struct pp__st_writer *w, const char *path);
pp_status pp__st_write(struct pp__st_writer *w, const void *data, uint64_t n);
pp_status pp__st_finish(struct pp__st_writer *w);
void pp__st_free(struct pp__st_writer *w);
/* "F32", "F16", "BF16"; NULL for Q8_0. */
const char *pp__st_dtype_name(enum pp_dtype t);

/* ---- HF side files (synth_hf_json.c) ---- */

/* config.json, tokenizer.json and tokenizer_config.json contents. */
pp_status pp__synth_hf_config(const struct pp__synth_model *m, struct pp_buf *b);
pp_status pp__synth_hf_tokenizer(const struct pp__synth_vocab *v, struct pp_buf *b);
pp_status pp__synth_hf_tokenizer_config(const struct pp__synth_model *m, struct pp_buf *b);

#endif
