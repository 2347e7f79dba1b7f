/* ppserve inspect: what a model file holds, as ppserve reads it (hyper-parameters, RoPE layout,
 * tokenizer, identity), without loading its weights. */
#include <stdio.h>

#include "client/args.h"
#include "client/commands.h"
#include "common/json_write.h"
#include "model/identity.h"
#include "model/model.h"
#include "model/tokenizer.h"

int pp_cmd_inspect(int argc, char **argv)
{
    const char *model = NULL;
    int json = 0, help = 0;
    struct pp_arg args[] = {
        {"model", PP_ARG_STRING, &model, 0, 0, "GGUF file or HF checkpoint directory (required)"},
        {"json", PP_ARG_FLAG, &json, 0, 0, "print one JSON line"},
        {"help", PP_ARG_FLAG, &help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("inspect", args, n, argc, argv, NULL);
    if (rc != 0 || help) {
        if (help)
            pp_args_usage("inspect", "--model PATH [--json]", args, n);
        return rc;
    }
    if (!model) {
        fprintf(stderr, "ppserve inspect: --model is required\n");
        return 2;
    }
    struct pp_model_config c;
    pp_status st = pp_model_read_config(model, &c);
    char id[PP_MODEL_ID_LEN];
    if (st == PP_OK)
        st = pp_model_identity(model, id);
    if (st != PP_OK)
        return pp_cli_fail("inspect", st);
    struct pp_tokenizer *tok = NULL;
    const char *tok_kind = pp_tokenizer_open(model, &tok) == PP_OK
                               ? pp_tokenizer_kind_name(pp_tokenizer_kind(tok))
                               : NULL;
    const char *format = c.format == PP_FORMAT_GGUF ? "gguf" : "hf";
    const char *rope = c.rope_layout == PP_ROPE_NEOX ? "rotate-half" : "interleaved";
    if (json) {
        struct pp_json j;
        pp_json_init(&j);
        pp_json_begin_object(&j);
        pp_json_key(&j, "format"), pp_json_cstring(&j, format);
        pp_json_key(&j, "arch"), pp_json_cstring(&j, pp_arch_name(c.arch));
        pp_json_key(&j, "identity"), pp_json_cstring(&j, id);
        pp_json_key(&j, "dim"), pp_json_int(&j, c.dim);
        pp_json_key(&j, "layers"), pp_json_int(&j, c.n_layers);
        pp_json_key(&j, "heads"), pp_json_int(&j, c.n_heads);
        pp_json_key(&j, "kv_heads"), pp_json_int(&j, c.n_kv_heads);
        pp_json_key(&j, "head_dim"), pp_json_int(&j, c.head_dim);
        pp_json_key(&j, "ffn"), pp_json_int(&j, c.ffn_dim);
        pp_json_key(&j, "vocab"), pp_json_int(&j, c.vocab_size);
        pp_json_key(&j, "context"), pp_json_int(&j, c.max_context);
        pp_json_key(&j, "rope_layout"), pp_json_cstring(&j, rope);
        pp_json_key(&j, "rope_theta"), pp_json_double(&j, c.rope_theta);
        pp_json_key(&j, "rope_llama3"), pp_json_bool(&j, c.rope_scaling.llama3);
        pp_json_key(&j, "tied_embeddings"), pp_json_bool(&j, c.tied_embeddings);
        pp_json_key(&j, "experts"), pp_json_int(&j, c.n_experts);
        if (c.n_experts > 0) {
            pp_json_key(&j, "experts_used"), pp_json_int(&j, c.n_experts_used);
            pp_json_key(&j, "expert_ffn"), pp_json_int(&j, c.expert_ffn_dim);
            pp_json_key(&j, "shared_ffn"), pp_json_int(&j, c.shared_ffn_dim);
            pp_json_key(&j, "norm_topk_prob"), pp_json_bool(&j, c.norm_topk_prob);
        }
        pp_json_key(&j, "tokenizer");
        if (tok_kind)
            pp_json_cstring(&j, tok_kind);
        else
            pp_json_null(&j);
        pp_json_end_object(&j);
        printf("%s\n", j.out.data && !j.out.failed ? j.out.data : "{}");
        pp_json_free(&j);
    } else {
        printf("%s (%s, %s)\n", model, format, pp_arch_name(c.arch));
        printf("  identity    %s\n", id);
        printf("  shape       dim %d, %d layers, %d heads (%d KV, head dim %d), ffn %d, vocab %d\n",
               c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size);
        printf("  context     %d%s\n", c.max_context,
               c.sliding_window ? " (sliding window)" : "");
        printf("  rope        %s, theta %g%s\n", rope, c.rope_theta,
               c.rope_scaling.llama3 ? ", llama3 scaling" : "");
        printf("  embeddings  %s\n",
               c.tied_embeddings ? "tied to the LM head" : "separate LM head");
        if (c.n_experts > 0)
            printf("  experts     %d, %d per token (%s), expert ffn %d, shared expert ffn %d\n",
                   c.n_experts, c.n_experts_used,
                   c.moe_gating == PP_MOE_TOPK_SOFTMAX ? "softmax over the top-k"
                   : c.norm_topk_prob                  ? "top-k of softmax, renormalised"
                                                       : "top-k of softmax",
                   c.expert_ffn_dim, c.shared_ffn_dim);
        printf("  tokenizer   %s\n", tok_kind ? tok_kind : "none (runs from token ids)");
    }
    pp_tokenizer_free(tok);
    return 0;
}
