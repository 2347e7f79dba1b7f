/* Synthetic model writer behind `ppserve synth`: builds a random but fully deterministic
 * decoder-only transformer (llama, mistral or qwen2 shape, or the mixtral and qwen2moe
 * Mixture-of-Experts shapes) and writes it as one GGUF file and/or as
 * an HF checkpoint directory. Both copies hold exactly the same f32 weight values (the GGUF copy is
 * a permutation of the HF one where the GGUF `llama` RoPE layout asks for it), so loaders, the
 * executor and the numpy reference can be checked against each other on any shape without
 * downloads.
 *
 * Every weight is a pure function of (seed, HF tensor name, element index); the tokenizer is a
 * small SentencePiece-style or byte-level BPE vocabulary trained on a built-in English text.
 * Not thread-safe across calls that write the same path; otherwise reentrant. */
#ifndef PP_SYNTH_H
#define PP_SYNTH_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/dtype.h"

/* The tokenizer written with the model, both trained on the built-in text. */
enum pp_synth_tokenizer {
    PP_SYNTH_TOKENIZER_SPM = 0, /* SentencePiece-style: GGUF llama; tokenizer.json with byte
                                   fallback and the ▁ normalizer; BOS <s> = 1, EOS </s> = 2 */
    PP_SYNTH_TOKENIZER_BPE,     /* byte-level BPE as Llama 3: GGUF gpt2 with merges and pre
                                   llama-bpe; tokenizer.json with Split(Llama 3 regex) + ByteLevel;
                                   BOS <|begin_of_text|> = 256, EOS <|end_of_text|> = 257 */
};

struct pp_synth_spec {
    char arch[16]; /* "llama", "mistral", "qwen2", "mixtral", "qwen2moe" */
    enum pp_synth_tokenizer tokenizer; /* zeroed: SPM */
    int32_t dim, n_layers, n_heads, n_kv_heads;
    int32_t head_dim; /* 0 = dim / n_heads */
    int32_t ffn_dim, vocab_size, max_context;
    enum pp_dtype dtype; /* weights; Q8_0 only for GGUF: the HF copy then stores the dequantized
                            values as F32 */
    uint64_t seed;
    int tied;         /* tie_word_embeddings: no output.weight / lm_head.weight */
    int qkv_bias;     /* write q/k/v biases; < 0 = the arch default (1 for qwen2, 0 otherwise) */
    int rope_llama3;  /* Llama 3.1 rope scaling: factor 8, low 1, high 4, original context 8192 */
    float rope_theta; /* 0 = default 10000 (500000 when rope_llama3) */
    float norm_eps;   /* 0 = default 1e-5 (1e-6 for qwen2) */
    int32_t sliding_window; /* mistral only, 0 = none */
    int32_t shards;         /* HF: number of safetensors shards (1 = model.safetensors, >1 =
                               model-0000i-of-0000n.safetensors + model.safetensors.index.json) */
    /* Mixture of experts (mixtral, qwen2moe only). GGUF stores each role's experts as one 3-D
     * tensor blk.N.ffn_{gate,up,down}_exps.weight; HF as one tensor per expert. */
    int32_t n_experts;      /* required for the MoE archs, 0 otherwise */
    int32_t n_experts_used; /* top-k, 1..n_experts */
    int32_t expert_ffn_dim; /* 0 = ffn_dim; mixtral: must be ffn_dim (its intermediate_size) */
    int32_t shared_ffn_dim; /* qwen2moe shared expert; 0 = ffn_dim; mixtral: must be 0 */
    int norm_topk_prob;     /* qwen2moe: renormalise the top-k weights; mixtral: must be 0 */
};

/* Fills *out with defaults (pp_synth_spec_defaults) and then a named shape: "tinyllama" (dim 2048,
 * 22 layers, 32 heads, 4 KV heads, FFN 5632, vocab 32000, ctx 2048, llama, f16), "demo" (dim 256,
 * 4 layers, 8 heads, 2 KV heads, ffn 688, vocab 1024, ctx 1024, llama, f32), "tiny" (dim 64,
 * 2 layers, 4 heads, 2 kv heads, ffn 160, vocab 300, ctx 256, llama, f32), "llama3-8b" (dim 4096,
 * 32 layers, 32 heads, 8 KV, ffn 14336, vocab 128256, ctx 8192, rope_llama3, bf16), "tiny-moe"
 * ("tiny" as mixtral with ffn 64, 4 experts, 2 used). Returns
 * PP_ERR_INVALID_ARG (with pp_error listing the known names) otherwise, leaving *out at defaults.
 */
pp_status pp_synth_shape(const char *name, struct pp_synth_spec *out);

/* Zeroes *s and sets arch "llama", dtype f32, seed 1, shards 1, and the "arch default" markers
 * (qkv_bias -1, rope_theta 0, norm_eps 0); fills nothing shape-related. */
void pp_synth_spec_defaults(struct pp_synth_spec *s);

/* Checks a spec (after applying the arch defaults above): every size in range, heads divide dim
 * unless head_dim is given, KV heads divide heads, head_dim even, Q8_0 rows a multiple of 32, vocab
 * >= 300 for the tokenizer, arch known, sliding window only for mistral, shards within the tensor
 * count, MoE fields only for the MoE archs with 1 <= n_experts_used <= n_experts. Returns PP_OK or
 * PP_ERR_INVALID_ARG with a message naming the field, what was expected and
 * what arrived. */
pp_status pp_synth_validate(const struct pp_synth_spec *s);

/* Writes the model as one GGUF v3 file at path (through a temporary file renamed at the end, so a
 * failed write never leaves a partial model at path). Validates first. Q8_0 allowed. */
pp_status pp_synth_write_gguf(const struct pp_synth_spec *s, const char *path);

/* Writes an HF checkpoint into dir (created, with parents, if needed): config.json, the safetensors
 * file(s) (+ model.safetensors.index.json when sharded), tokenizer.json, tokenizer_config.json.
 * Each file goes through a temporary file and a rename. Validates first. */
pp_status pp_synth_write_hf(const struct pp_synth_spec *s, const char *dir);

#endif
