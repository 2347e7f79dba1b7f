/* ppserve run: load a model, generate for one prompt in this process, stream or print JSON. */
#include <stdio.h>
#include <string.h>

#include "client/args.h"
#include "client/sampling_args.h"
#include "client/commands.h"
#include "common/alloc.h"
#include "common/json_write.h"
#include "common/limits.h"
#include "common/log.h"
#include "kernels/devices.h"
#include "model/executor.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/shard.h"
#include "model/tokenizer.h"

struct run_opts {
    const char *model;
    const char *prompt;
    struct pp_id_list prompt_ids;
    int32_t max_tokens;
    struct pp_sampling sampling;
    struct pp_str_list stops;
    int32_t threads;
    int32_t tp;
    int32_t ep;
    int32_t ctx;
    const char *device;
    const char *cpu_weights;
    const char *dump_logits;
    const char *log_level;
    int json;
    int ignore_eos;
    int help;
};

struct run_out {
    FILE *logits;
    int stream_text;
    int stream_ids;
    int write_failed;
};

static void on_token(void *ud, int32_t id, const float *logits, int32_t vocab)
{
    struct run_out *o = ud;
    if (o->logits && fwrite(logits, sizeof(float), (size_t)vocab, o->logits) != (size_t)vocab)
        o->write_failed = 1;
    if (o->stream_ids) {
        printf("%d ", id);
        fflush(stdout);
    }
}

static void on_text(void *ud, const char *s, size_t n)
{
    struct run_out *o = ud;
    if (o->stream_text) {
        fwrite(s, 1, n, stdout);
        fflush(stdout);
    }
}

static void print_json(const struct pp_gen_request *req, const struct pp_gen_result *res,
                       int has_tok)
{
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_key(&j, "prompt_ids");
    pp_json_begin_array(&j);
    for (int32_t i = 0; i < req->n_prompt; i++)
        pp_json_int(&j, req->prompt[i]);
    pp_json_end_array(&j);
    pp_json_key(&j, "ids");
    pp_json_begin_array(&j);
    for (int32_t i = 0; i < res->n_ids; i++)
        pp_json_int(&j, res->ids[i]);
    pp_json_end_array(&j);
    pp_json_key(&j, "text");
    if (has_tok)
        pp_json_string(&j, res->text, res->text_len);
    else
        pp_json_null(&j);
    pp_json_key(&j, "finish_reason");
    pp_json_cstring(&j, pp_finish_reason_name(res->finish));
    pp_json_key(&j, "prefill_tokens_per_s");
    pp_json_double(&j, res->prefill_seconds > 0 ? req->n_prompt / res->prefill_seconds : 0.0);
    pp_json_key(&j, "decode_tokens_per_s");
    pp_json_double(&j, res->decode_seconds > 0 && res->n_ids > 1
                           ? (res->n_ids - 1) / res->decode_seconds : 0.0);
    pp_json_end_object(&j);
    printf("%s\n", j.out.data && !j.out.failed ? j.out.data : "{}");
    pp_json_free(&j);
}

/* The executor's options: one sequence of the context asked for. */
static struct pp_executor_opts executor_opts(const struct run_opts *o)
{
    struct pp_executor_opts eo = {0};
    eo.max_seqs = 1;
    eo.max_context = o->ctx;
    eo.ep = o->ep;
    return eo;
}

static int generate(struct run_opts *o, struct pp_model *m, struct pp_tokenizer *tok,
                    struct pp_backend *const *bes)
{
    int32_t *ids = o->prompt_ids.ids, n_ids = o->prompt_ids.n;
    int32_t *encoded = NULL;
    pp_status st;
    if (o->prompt) {
        if (!tok)
            return pp_cli_fail("run", PP_ERR_INVALID_ARG);
        if ((st = pp_tokenizer_encode(tok, o->prompt, strlen(o->prompt), pp_tokenizer_add_bos(tok),
                                      &encoded, &n_ids)) != PP_OK)
            return pp_cli_fail("run", st);
        ids = encoded;
    }
    struct pp_executor_opts eo = executor_opts(o);
    struct pp_executor *ex = NULL;
    int rc = 0;
    struct run_out out = {0};
    if ((st = pp_executor_new_workers(m, bes, o->tp, &eo, &ex)) != PP_OK) {
        rc = pp_cli_fail("run", st);
        goto done;
    }
    if (o->dump_logits && !(out.logits = fopen(o->dump_logits, "wb"))) {
        fprintf(stderr, "ppserve run: error: cannot write %s\n", o->dump_logits);
        rc = 1;
        goto done;
    }
    out.stream_text = !o->json && tok;
    out.stream_ids = !o->json && !tok;
    struct pp_gen_request req = {ids, n_ids, o->max_tokens, o->sampling, o->stops.items,
                                 o->stops.n, o->ignore_eos, 1};
    struct pp_gen_callbacks cb = {on_token, on_text, &out};
    struct pp_gen_result res;
    if ((st = pp_generate(ex, tok, &req, &cb, &res)) != PP_OK) {
        rc = pp_cli_fail("run", st);
        goto done;
    }
    if (o->json) {
        print_json(&req, &res, tok != NULL);
    } else {
        printf("\n");
        fprintf(stderr, "ppserve run: %d prompt tokens at %.1f tok/s, %d generated at %.1f tok/s, "
                "finish=%s\n", n_ids, res.prefill_seconds > 0 ? n_ids / res.prefill_seconds : 0.0,
                res.n_ids, res.decode_seconds > 0 && res.n_ids > 1
                               ? (res.n_ids - 1) / res.decode_seconds : 0.0,
                pp_finish_reason_name(res.finish));
    }
    pp_gen_result_free(&res);
    if (out.write_failed) {
        fprintf(stderr, "ppserve run: error: writing %s failed\n", o->dump_logits);
        rc = 1;
    }
done:
    if (out.logits && fclose(out.logits) != 0 && rc == 0) {
        fprintf(stderr, "ppserve run: error: closing %s failed\n", o->dump_logits);
        rc = 1;
    }
    pp_executor_free(ex);
    pp_free(PP_MEM_MISC, encoded);
    return rc;
}

/* cpu_weights = copy holds a copy of every weight beside the KV cache; where that does not fit the
 * memory this process may use (a cgroup limit), the kernel would stop the process mid-load with no
 * word, so the weights are used from the mapped file instead (whose pages the kernel can drop and
 * read again). Returns 1 to map. */
static int copy_would_not_fit(const struct run_opts *o, const struct pp_model *m)
{
    struct pp_executor_opts eo = executor_opts(o);
    int64_t kv = pp_executor_kv_budget(m, o->tp, &eo);
    struct pp_memory mem;
    char why[1024];
    pp_memory_read(&mem);
    if (pp_memory_fits(&mem, (uint64_t)pp_model_weight_bytes(m), (uint64_t)kv, why, sizeof(why)))
        return 0;
    PP_WARN("cpu_weights=copy: %s; computing from the mapped model file instead (--cpu-weights "
            "map)", why);
    return 1;
}

int pp_cmd_run(int argc, char **argv)
{
    struct run_opts o = {0};
    o.max_tokens = 64;
    o.log_level = "warn";
    pp_sampling_defaults(&o.sampling);
    o.threads = 0; /* the CPUs this process may use (common/limits.h) */
    o.tp = 1;
    o.ep = 0;
    o.device = "auto";
    o.cpu_weights = "copy";
    struct pp_arg args[] = {
        {"model", PP_ARG_STRING, &o.model, 0, 0, "GGUF file or HF checkpoint directory (required)"},
        {"prompt", PP_ARG_STRING, &o.prompt, 0, 0, "prompt text (needs the model's tokenizer)"},
        {"prompt-ids", PP_ARG_IDS, &o.prompt_ids, 0, 0, "prompt token ids, used exactly as given"},
        {"max-tokens", PP_ARG_INT, &o.max_tokens, 0, 1 << 24, "tokens to generate (default 64)"},
        PP_SAMPLING_ARGS(&o.sampling, &o.stops, &o.ignore_eos),
        {"threads", PP_ARG_INT, &o.threads, 1, 1024,
         "compute threads (default: the CPUs this process may use, its affinity and cgroup quota)"},
        {"tp", PP_ARG_INT, &o.tp, 1, 64,
         "tensor-parallel workers, each with threads/tp threads (default 1; --ep alone sets it)"},
        {"ep", PP_ARG_INT, &o.ep, 1, 64,
         "expert groups among the workers (MoE models; divides tp)"},
        {"ctx", PP_ARG_INT, &o.ctx, 1, 1 << 24, "context length (default: the model's)"},
        {"device", PP_ARG_STRING, &o.device, 0, 0,
         "auto | cpu | cuda:N[,N...] (default auto: the GPUs when present, else the CPU; a GPU "
         "list sets --tp to its length)"},
        {"cpu-weights", PP_ARG_STRING, &o.cpu_weights, 0, 0,
         "copy | map: the CPU copies weights into huge-page memory (default; faster decode) or "
         "computes from the mapped model file (no copy)"},
        {"dump-logits", PP_ARG_STRING, &o.dump_logits, 0, 0,
         "write f32 logits per generated token"},
        {"json", PP_ARG_FLAG, &o.json, 0, 0, "print one JSON line instead of streaming text"},
        {"log-level", PP_ARG_STRING, &o.log_level, 0, 0, "debug|info|warn|error (default warn)"},
        {"help", PP_ARG_FLAG, &o.help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("run", args, n, argc, argv, NULL);
    if (rc != 0 || o.help) {
        if (o.help)
            pp_args_usage("run", "--model PATH (--prompt TEXT | --prompt-ids 1,2,3) [flags]", args,
                          n);
        pp_id_list_free(&o.prompt_ids);
        return rc;
    }
    int level = pp_log_level_parse(o.log_level);
    if (!o.model || (!o.prompt == !o.prompt_ids.ids) || level < 0) {
        fprintf(stderr, "ppserve run: %s\n",
                level < 0 ? "--log-level: expected debug, info, warn or error"
                : !o.model ? "--model is required"
                           : "give exactly one of --prompt and --prompt-ids");
        pp_id_list_free(&o.prompt_ids);
        return 2;
    }
    pp_log_init("run", (enum pp_log_level)level);
    struct pp_model *m = NULL;
    struct pp_tokenizer *tok = NULL;
    struct pp_backend *bes[64] = {0};
    int tp_given = pp_args_seen(args, n, "tp");
    if (o.ep > 0 && !tp_given)
        o.tp = o.ep; /* --ep E alone: pure expert parallelism over E workers */
    struct pp_device_spec want, use;
    if (pp_device_spec_parse(o.device, &want) != PP_OK) {
        fprintf(stderr, "ppserve run: --device: %s\n", pp_error_detail());
        pp_id_list_free(&o.prompt_ids);
        return 2;
    }
    int map_weights = 0;
    if (pp_cpu_weights_parse(o.cpu_weights, &map_weights) != PP_OK) {
        fprintf(stderr, "ppserve run: --cpu-weights: %s\n", pp_error_detail());
        pp_id_list_free(&o.prompt_ids);
        return 2;
    }
    if (want.kind == PP_DEVICE_CUDA && !tp_given && o.ep == 0)
        o.tp = want.n; /* one worker per listed GPU */
    char note[512];
    pp_status st = pp_devices_resolve(&want, o.tp, &use, note, sizeof(note));
    if (st != PP_OK) {
        rc = pp_cli_fail("run", st);
        goto done;
    }
    char used[1024];
    pp_device_spec_format(&use, used, sizeof(used));
    if (note[0])
        PP_INFO("device=%s requested=%s reason=\"no GPU is used: %s\"", used, o.device, note);
    else
        PP_INFO("device=%s requested=%s", used, o.device);
    st = pp_model_open(o.model, 0, -1, &m);
    if (st != PP_OK) {
        rc = pp_cli_fail("run", st);
        goto done;
    }
    st = pp_tokenizer_load(m, &tok);
    if (st != PP_OK) {
        if (o.prompt || o.stops.n > 0) {
            rc = pp_cli_fail("run", st);
            goto done;
        }
        PP_INFO("no tokenizer: %s", pp_error_detail());
        tok = NULL;
    }
    struct pp_cpus cpus;
    pp_cpus_read(&cpus);
    char cpu_note[1024], cpu_warn[1024];
    pp_cpus_describe(&cpus, cpu_note, sizeof(cpu_note));
    o.threads = pp_cpus_threads(&cpus, o.threads, cpu_warn, sizeof(cpu_warn));
    PP_INFO("cpus: %s", cpu_note);
    if (use.kind == PP_DEVICE_CPU && cpu_warn[0])
        PP_WARN("%s", cpu_warn);
    if ((st = pp_shard_check(&m->cfg, o.tp, o.ep > 0 ? o.ep : 1, o.model)) != PP_OK ||
        (st = pp_backends_new(&use, o.threads, o.tp, bes)) != PP_OK) {
        rc = pp_cli_fail("run", st);
        goto done;
    }
    if (use.kind == PP_DEVICE_CPU && !map_weights)
        map_weights = copy_would_not_fit(&o, m);
    for (int r = 0; r < o.tp; r++)
        pp_backend_cpu_map_weights(bes[r], map_weights);
    if (use.kind == PP_DEVICE_CPU && o.tp > o.threads)
        PP_WARN("--tp %d with %d threads: each worker still runs one thread, so %d threads share "
                "the cores", o.tp, o.threads, o.tp);
    PP_INFO("model=%s arch=%s layers=%d dim=%d vocab=%d device=%s threads=%d tp=%d ep=%d",
            o.model, pp_arch_name(m->cfg.arch), m->cfg.n_layers, m->cfg.dim, m->cfg.vocab_size,
            used, o.threads, o.tp, o.ep > 0 ? o.ep : 1);
    rc = generate(&o, m, tok, bes);
done:
    pp_backend_free_all(bes, 64);
    pp_tokenizer_free(tok);
    pp_model_free(m);
    pp_id_list_free(&o.prompt_ids);
    return rc;
}
