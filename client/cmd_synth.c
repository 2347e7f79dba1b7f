/* ppserve synth: write a synthetic model for demos, tests and benchmarks. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "client/args.h"
#include "client/commands.h"
#include "common/fs.h"
#include "model/synth.h"

int pp_cmd_synth(int argc, char **argv)
{
    struct pp_synth_spec s;
    pp_synth_spec_defaults(&s);
    const char *out = NULL, *shape = NULL, *dtype = NULL, *format = "gguf", *arch = NULL;
    const char *tokenizer = "spm";
    int help = 0, tied = 0, llama3 = 0;
    int32_t qkv_bias = -1;
    uint64_t seed = 0;
    struct pp_synth_spec sz = {0};
    struct pp_arg args[] = {
        {"out", PP_ARG_STRING, &out, 0, 0, "output folder (required)"},
        {"shape", PP_ARG_STRING, &shape, 0, 0, "tinyllama | demo | tiny | llama3-8b | tiny-moe"},
        {"arch", PP_ARG_STRING, &arch, 0, 0,
         "llama | mistral | qwen2 | mixtral | qwen2moe (default llama)"},
        {"dim", PP_ARG_INT, &sz.dim, 1, 1 << 16, "hidden size"},
        {"layers", PP_ARG_INT, &sz.n_layers, 1, 1024, "layer count"},
        {"heads", PP_ARG_INT, &sz.n_heads, 1, 1024, "attention heads"},
        {"kv-heads", PP_ARG_INT, &sz.n_kv_heads, 1, 1024, "KV heads (default: heads)"},
        {"head-dim", PP_ARG_INT, &sz.head_dim, 2, 1024, "head dim (default: dim / heads)"},
        {"ffn", PP_ARG_INT, &sz.ffn_dim, 1, 1 << 20, "FFN size"},
        {"vocab", PP_ARG_INT, &sz.vocab_size, 300, 1 << 20, "vocabulary size (>= 300)"},
        {"ctx", PP_ARG_INT, &sz.max_context, 1, 1 << 20, "context length"},
        {"dtype", PP_ARG_STRING, &dtype, 0, 0,
         "f32 | f16 | bf16 | q8_0 (q8_0: quantized in GGUF; an HF checkpoint holds the same "
         "values dequantized, as float32)"},
        {"seed", PP_ARG_U64, &seed, 0, 0, "weight seed (default 1)"},
        {"format", PP_ARG_STRING, &format, 0, 0, "gguf | hf | both (default gguf)"},
        {"tied", PP_ARG_FLAG, &tied, 0, 0, "tie the LM head to the embedding"},
        {"qkv-bias", PP_ARG_INT, &qkv_bias, 0, 1, "write q/k/v biases (default: 1 for qwen2)"},
        {"rope-llama3", PP_ARG_FLAG, &llama3, 0, 0, "Llama 3.1 rope scaling"},
        {"rope-theta", PP_ARG_FLOAT, &sz.rope_theta, 1.0001, 1e9, "RoPE base"},
        {"norm-eps", PP_ARG_FLOAT, &sz.norm_eps, 1e-12, 0.1,
         "RMSNorm epsilon (default 1e-5, qwen2 1e-6)"},
        {"sliding-window", PP_ARG_INT, &sz.sliding_window, 0, 1 << 24, "mistral sliding window"},
        {"shards", PP_ARG_INT, &sz.shards, 1, 1000, "HF safetensors shards (default 1)"},
        {"experts", PP_ARG_INT, &sz.n_experts, 1, 1024, "MoE experts (mixtral, qwen2moe)"},
        {"experts-used", PP_ARG_INT, &sz.n_experts_used, 1, 1024, "MoE experts per token (top-k)"},
        {"expert-ffn", PP_ARG_INT, &sz.expert_ffn_dim, 1, 1 << 20,
         "expert FFN size (default --ffn; mixtral: must be --ffn)"},
        {"shared-ffn", PP_ARG_INT, &sz.shared_ffn_dim, 1, 1 << 20,
         "qwen2moe shared expert FFN size (default --ffn)"},
        {"norm-topk", PP_ARG_INT, &sz.norm_topk_prob, 0, 1,
         "qwen2moe: renormalise the top-k weights (default 0)"},
        {"tokenizer", PP_ARG_STRING, &tokenizer, 0, 0,
         "spm | bpe (byte-level, Llama 3 style) (default spm)"},
        {"help", PP_ARG_FLAG, &help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("synth", args, n, argc, argv, NULL);
    if (rc != 0 || help) {
        if (help)
            pp_args_usage("synth", "--out DIR (--shape NAME | --dim D --layers L --heads H "
                          "--kv-heads K --ffn F --vocab V) [flags]", args, n);
        return rc;
    }
    if (!out) {
        fprintf(stderr, "ppserve synth: --out is required\n");
        return 2;
    }
    if (shape) {
        if (pp_synth_shape(shape, &s) != PP_OK)
            return pp_cli_fail("synth", PP_ERR_INVALID_ARG);
    } else if (!sz.dim || !sz.n_layers || !sz.n_heads || !sz.ffn_dim || !sz.vocab_size) {
        fprintf(stderr, "ppserve synth: give --shape NAME, or all of --dim --layers --heads --ffn "
                "--vocab\n");
        return 2;
    }
    /* explicit flags override the shape */
#define OVERRIDE(field, flag)                                                                      \
    if (pp_args_seen(args, n, flag))                                                               \
        s.field = sz.field;
    OVERRIDE(dim, "dim")
    OVERRIDE(n_layers, "layers")
    OVERRIDE(n_heads, "heads")
    OVERRIDE(n_kv_heads, "kv-heads")
    OVERRIDE(head_dim, "head-dim")
    OVERRIDE(ffn_dim, "ffn")
    OVERRIDE(vocab_size, "vocab")
    OVERRIDE(max_context, "ctx")
    OVERRIDE(rope_theta, "rope-theta")
    OVERRIDE(norm_eps, "norm-eps")
    OVERRIDE(sliding_window, "sliding-window")
    OVERRIDE(shards, "shards")
    OVERRIDE(n_experts, "experts")
    OVERRIDE(n_experts_used, "experts-used")
    OVERRIDE(expert_ffn_dim, "expert-ffn")
    OVERRIDE(shared_ffn_dim, "shared-ffn")
    OVERRIDE(norm_topk_prob, "norm-topk")
#undef OVERRIDE
    if (pp_args_seen(args, n, "seed"))
        s.seed = seed;
    if (!shape && !pp_args_seen(args, n, "kv-heads"))
        s.n_kv_heads = s.n_heads;
    if (!s.max_context)
        s.max_context = 2048;
    if (arch)
        snprintf(s.arch, sizeof(s.arch), "%s", arch);
    if (dtype) {
        int t = pp_dtype_parse(dtype);
        if (t < 0) {
            fprintf(stderr, "ppserve synth: --dtype: expected f32, f16, bf16 or q8_0, got '%s'\n",
                    dtype);
            return 2;
        }
        s.dtype = (enum pp_dtype)t;
    }
    if (tied)
        s.tied = 1;
    if (llama3)
        s.rope_llama3 = 1;
    if (qkv_bias >= 0)
        s.qkv_bias = qkv_bias;
    if (strcmp(tokenizer, "spm") == 0) {
        s.tokenizer = PP_SYNTH_TOKENIZER_SPM;
    } else if (strcmp(tokenizer, "bpe") == 0) {
        s.tokenizer = PP_SYNTH_TOKENIZER_BPE;
    } else {
        fprintf(stderr, "ppserve synth: --tokenizer: expected spm or bpe, got '%s'\n", tokenizer);
        return 2;
    }
    int gguf = strcmp(format, "gguf") == 0 || strcmp(format, "both") == 0;
    int hf = strcmp(format, "hf") == 0 || strcmp(format, "both") == 0;
    if (!gguf && !hf) {
        fprintf(stderr, "ppserve synth: --format: expected gguf, hf or both, got '%s'\n", format);
        return 2;
    }
    pp_status st = pp_synth_validate(&s);
    if (st != PP_OK)
        return pp_cli_fail("synth", st);
    if ((st = pp_mkdirs(out)) != PP_OK)
        return pp_cli_fail("synth", st);
    char path[4096];
    if (gguf) {
        snprintf(path, sizeof(path), "%s/model.gguf", out);
        if ((st = pp_synth_write_gguf(&s, path)) != PP_OK)
            return pp_cli_fail("synth", st);
        printf("%s\n", path);
    }
    if (hf) {
        snprintf(path, sizeof(path), "%s/hf", out);
        if ((st = pp_synth_write_hf(&s, path)) != PP_OK)
            return pp_cli_fail("synth", st);
        printf("%s\n", path);
    }
    return 0;
}
