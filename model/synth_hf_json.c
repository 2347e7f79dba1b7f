/* The JSON side files of a synthetic HF checkpoint: config.json, tokenizer.json (the Llama 2 /
 * Mistral form of a SentencePiece BPE: byte fallback, a normalizer that prepends U+2581 and maps
 * spaces to it, ranked merges) and tokenizer_config.json. */
#include <string.h>

#include "model/synth-impl.h"

#define SPACE_MARK "\xe2\x96\x81" /* U+2581 */

static const char *torch_dtype(enum pp_dtype t)
{
    switch (t) {
    case PP_DTYPE_F16:
        return "float16";
    case PP_DTYPE_BF16:
        return "bfloat16";
    default:
        return "float32"; /* Q8_0 is stored dequantized */
    }
}

pp_status pp__synth_hf_config(const struct pp__synth_model *m, struct pp_buf *b)
{
    static const char *const classes[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                          "Qwen2ForCausalLM", "MixtralForCausalLM",
                                          "Qwen2MoeForCausalLM"};
    static const char *const model_types[] = {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe"};
    const struct pp_synth_spec *s = &m->s;
    pp_buf_printf(b, "{\n  \"architectures\": [\"%s\"],\n", classes[m->arch]);
    pp_buf_printf(b, "  \"model_type\": \"%s\",\n", model_types[m->arch]);
    pp_buf_puts(b, "  \"hidden_act\": \"silu\",\n");
    pp_buf_printf(b, "  \"hidden_size\": %d,\n", s->dim);
    pp_buf_printf(b, "  \"intermediate_size\": %d,\n", s->ffn_dim);
    pp_buf_printf(b, "  \"num_hidden_layers\": %d,\n", s->n_layers);
    pp_buf_printf(b, "  \"num_attention_heads\": %d,\n", s->n_heads);
    pp_buf_printf(b, "  \"num_key_value_heads\": %d,\n", s->n_kv_heads);
    pp_buf_printf(b, "  \"head_dim\": %d,\n", s->head_dim);
    pp_buf_printf(b, "  \"vocab_size\": %d,\n", s->vocab_size);
    pp_buf_printf(b, "  \"max_position_embeddings\": %d,\n", s->max_context);
    pp_buf_puts(b, "  \"rms_norm_eps\": ");
    pp__synth_json_float(b, s->norm_eps);
    pp_buf_puts(b, ",\n  \"rope_theta\": ");
    pp__synth_json_float(b, s->rope_theta);
    if (s->rope_llama3)
        pp_buf_puts(b, ",\n  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                         "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                         "\"original_max_position_embeddings\": 8192}");
    else
        pp_buf_puts(b, ",\n  \"rope_scaling\": null");
    if (m->arch == PP__SYNTH_MISTRAL) {
        if (s->sliding_window)
            pp_buf_printf(b, ",\n  \"sliding_window\": %d", s->sliding_window);
        else
            pp_buf_puts(b, ",\n  \"sliding_window\": null");
    }
    if (m->arch == PP__SYNTH_MIXTRAL)
        pp_buf_printf(b, ",\n  \"sliding_window\": null,\n  \"num_local_experts\": %d,\n"
                      "  \"num_experts_per_tok\": %d", s->n_experts, s->n_experts_used);
    if (m->arch == PP__SYNTH_QWEN2MOE)
        pp_buf_printf(b, ",\n  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n"
                      "  \"moe_intermediate_size\": %d,\n"
                      "  \"shared_expert_intermediate_size\": %d,\n"
                      "  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": 1,\n"
                      "  \"mlp_only_layers\": [],\n  \"use_sliding_window\": false",
                      s->n_experts, s->n_experts_used, s->expert_ffn_dim, s->shared_ffn_dim,
                      s->norm_topk_prob ? "true" : "false");
    pp_buf_printf(b, ",\n  \"tie_word_embeddings\": %s", s->tied ? "true" : "false");
    int32_t bos, eos;
    pp__synth_vocab_specials(s->tokenizer, &bos, &eos);
    pp_buf_printf(b, ",\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d", bos, eos);
    pp_buf_printf(b, ",\n  \"torch_dtype\": \"%s\"\n}\n", torch_dtype(s->dtype));
    return PP_OK;
}

static void added_tokens(const struct pp__synth_vocab *v, struct pp_buf *b)
{
    if (v->byte_level) { /* every control token: the two specials and the reserved fillers */
        pp_buf_puts(b, "  \"added_tokens\": [");
        int first = 1;
        for (int32_t id = 0; id < v->n; id++) {
            if (v->types[id] != PP__TOK_CONTROL)
                continue;
            pp_buf_printf(b, "%s\n    {\"id\": %d, \"content\": ", first ? "" : ",", id);
            pp__synth_json_cstr(b, v->tokens[id]);
            pp_buf_puts(b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                             "\"normalized\": false, \"special\": true}");
            first = 0;
        }
        pp_buf_puts(b, "\n  ],\n");
        return;
    }
    /* the specials and the unused filler tokens: special, so decoding drops them as GGUF readers
     * drop control and unused tokens */
    pp_buf_puts(b, "  \"added_tokens\": [");
    for (int32_t id = 0; id < v->n; id++) {
        if (id >= 3 && v->types[id] != PP__TOK_UNUSED)
            continue;
        pp_buf_printf(b, "%s\n    {\"id\": %d, \"content\": ", id ? "," : "", id);
        pp__synth_json_cstr(b, v->tokens[id]);
        pp_buf_puts(b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                         "\"normalized\": false, \"special\": true}");
    }
    pp_buf_puts(b, "\n  ],\n");
}

static void pipeline(struct pp_buf *b)
{
    pp_buf_puts(b, "  \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
                     "{\"type\": \"Prepend\", \"prepend\": \"" SPACE_MARK "\"}, "
                     "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                     "\"content\": \"" SPACE_MARK "\"}]},\n");
    pp_buf_puts(b, "  \"pre_tokenizer\": null,\n");
    pp_buf_puts(b, "  \"post_processor\": {\"type\": \"TemplateProcessing\", "
                     "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
                     "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
                     "\"pair\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
                     "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
                     "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 1}}, "
                     "{\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], "
                     "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], "
                     "\"tokens\": [\"<s>\"]}}},\n");
    pp_buf_puts(b, "  \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
                     "{\"type\": \"Replace\", \"pattern\": {\"String\": \"" SPACE_MARK "\"}, "
                     "\"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
                     "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},\n");
}

/* The Llama 3 form of a byte-level BPE: Split by the Llama 3 regex, then ByteLevel without its own
 * regex; BOS added by the post-processor template; ByteLevel decoder. */
#define LLAMA3_REGEX_JSON                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "     \
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"

static void byte_level_pipeline(struct pp_buf *b)
{
    pp_buf_puts(b, "  \"normalizer\": null,\n");
    pp_buf_puts(b, "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
                     "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"" LLAMA3_REGEX_JSON "\"}, "
                     "\"behavior\": \"Isolated\", \"invert\": false}, "
                     "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                     "\"trim_offsets\": true, \"use_regex\": false}]},\n");
    pp_buf_puts(b, "  \"post_processor\": {\"type\": \"Sequence\", \"processors\": ["
                     "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": "
                     "false, \"use_regex\": true}, {\"type\": \"TemplateProcessing\", "
                     "\"single\": [{\"SpecialToken\": {\"id\": \"<|begin_of_text|>\", "
                     "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
                     "\"pair\": [{\"SpecialToken\": {\"id\": \"<|begin_of_text|>\", "
                     "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
                     "{\"SpecialToken\": {\"id\": \"<|begin_of_text|>\", \"type_id\": 1}}, "
                     "{\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], "
                     "\"special_tokens\": {\"<|begin_of_text|>\": {\"id\": "
                     "\"<|begin_of_text|>\", \"ids\": [256], \"tokens\": "
                     "[\"<|begin_of_text|>\"]}}}]},\n");
    pp_buf_puts(b, "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
                     "\"trim_offsets\": true, \"use_regex\": true},\n");
}

static void bpe_model(const struct pp__synth_vocab *v, struct pp_buf *b)
{
    if (v->byte_level)
        pp_buf_puts(b, "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": "
                         "null, \"continuing_subword_prefix\": null, \"end_of_word_suffix\": "
                         "null, \"fuse_unk\": false, \"byte_fallback\": false, "
                         "\"ignore_merges\": true,\n    \"vocab\": {");
    else
        pp_buf_puts(b,
                  "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", "
                  "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, "
                  "\"fuse_unk\": true, \"byte_fallback\": true,\n    \"vocab\": {");
    for (int32_t id = 0; id < v->n; id++) {
        pp_buf_puts(b, id ? ",\n      " : "\n      ");
        pp__synth_json_cstr(b, v->tokens[id]);
        pp_buf_printf(b, ": %d", id);
    }
    pp_buf_puts(b, "\n    },\n    \"merges\": [");
    struct pp_buf pair = {0};
    for (int32_t k = 0; k < v->n_merges; k++) {
        pair.len = 0;
        pp_buf_puts(&pair, v->tokens[v->merges[2 * k]]);
        pp_buf_puts(&pair, " ");
        pp_buf_puts(&pair, v->tokens[v->merges[2 * k + 1]]);
        pp_buf_put(&pair, "", 1);
        pp_buf_puts(b, k ? ",\n      " : "\n      ");
        if (pair.failed)
            b->failed = 1;
        else
            pp__synth_json_cstr(b, pair.data);
    }
    pp_buf_free(&pair);
    pp_buf_puts(b, "\n    ]\n  }\n");
}

pp_status pp__synth_hf_tokenizer(const struct pp__synth_vocab *v, struct pp_buf *b)
{
    pp_buf_puts(b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n");
    added_tokens(v, b);
    if (v->byte_level)
        byte_level_pipeline(b);
    else
        pipeline(b);
    bpe_model(v, b);
    pp_buf_puts(b, "}\n");
    return PP_OK;
}

pp_status pp__synth_hf_tokenizer_config(const struct pp__synth_model *m, struct pp_buf *b)
{
    if (m->s.tokenizer == PP_SYNTH_TOKENIZER_BPE) {
        pp_buf_puts(b, "{\n  \"add_bos_token\": true,\n  \"add_eos_token\": false,\n"
                         "  \"bos_token\": \"<|begin_of_text|>\",\n"
                         "  \"eos_token\": \"<|end_of_text|>\",\n  \"pad_token\": null,\n"
                         "  \"clean_up_tokenization_spaces\": true,\n");
        pp_buf_printf(b, "  \"model_max_length\": %d,\n", m->s.max_context);
        pp_buf_puts(b, "  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n");
        return PP_OK;
    }
    pp_buf_puts(b, "{\n  \"add_bos_token\": true,\n  \"add_eos_token\": false,\n"
                     "  \"bos_token\": \"<s>\",\n  \"eos_token\": \"</s>\",\n"
                     "  \"unk_token\": \"<unk>\",\n  \"pad_token\": null,\n"
                     "  \"clean_up_tokenization_spaces\": false,\n");
    pp_buf_printf(b, "  \"model_max_length\": %d,\n", m->s.max_context);
    pp_buf_puts(b, "  \"tokenizer_class\": \"LlamaTokenizerFast\"\n}\n");
    return PP_OK;
}
