/* ppserve tokenize / detokenize: text ⇄ token ids with a model's own tokenizer, without loading its
 * weights; `tokenize --bench FILE` measures encoding speed (MB/s). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/args.h"
#include "client/commands.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/json_write.h"
#include "model/tokenizer.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct pp_buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        pp_buf_put(&b, chunk, n);
    int bad = ferror(f) || b.failed;
    fclose(f);
    if (bad || !pp_buf_reserve(&b, 1)) {
        pp_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.data;
}

static int bench(const struct pp_tokenizer *tok, const char *path, int json)
{
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) {
        fprintf(stderr, "ppserve tokenize: error: cannot read %s\n", path);
        return 1;
    }
    int32_t *ids = NULL, n = 0;
    double best = 1e30, t0 = pp_clock_mono();
    int rounds = 0;
    pp_status st = PP_OK;
    while (st == PP_OK && (rounds < 3 || pp_clock_mono() - t0 < 1.0) && rounds < 50) {
        double a = pp_clock_mono();
        pp_free(PP_MEM_MISC, ids);
        ids = NULL;
        st = pp_tokenizer_encode_ex(tok, text, len, PP_TOKENIZE_PARSE_SPECIAL, &ids, &n);
        double dt = pp_clock_mono() - a;
        best = dt < best ? dt : best;
        rounds++;
    }
    pp_free(PP_MEM_MISC, ids);
    pp_free(PP_MEM_MISC, text);
    if (st != PP_OK)
        return pp_cli_fail("tokenize", st);
    double mbs = (double)len / 1e6 / (best > 0 ? best : 1e-9);
    if (json)
        printf("{\"bytes\":%zu,\"tokens\":%d,\"seconds\":%.6f,\"mb_per_s\":%.2f,\"kind\":\"%s\"}\n",
               len, n, best, mbs, pp_tokenizer_kind_name(pp_tokenizer_kind(tok)));
    else
        printf("%s: %zu bytes -> %d tokens in %.4f s (best of %d): %.2f MB/s (%s)\n", path, len, n,
               best, rounds, mbs, pp_tokenizer_kind_name(pp_tokenizer_kind(tok)));
    return 0;
}

static int load(const char *cmd, const char *model, struct pp_tokenizer **tok)
{
    pp_status st = pp_tokenizer_open(model, tok);
    return st == PP_OK ? 0 : pp_cli_fail(cmd, st);
}

int pp_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL, *bench_file = NULL, *positional = NULL;
    int json = 0, no_bos = 0, no_special = 0, help = 0;
    struct pp_arg args[] = {
        {"model", PP_ARG_STRING, &model, 0, 0, "GGUF file or HF checkpoint directory (required)"},
        {"text", PP_ARG_STRING, &text, 0, 0, "the text (or give it as the last argument)"},
        {"file", PP_ARG_STRING, &file, 0, 0, "read the text from this file"},
        {"json", PP_ARG_FLAG, &json, 0, 0, "print {\"ids\":[...]}"},
        {"no-bos", PP_ARG_FLAG, &no_bos, 0, 0, "never add BOS (default: the model's setting)"},
        {"no-special", PP_ARG_FLAG, &no_special, 0, 0, "treat special-token text as plain text"},
        {"bench", PP_ARG_STRING, &bench_file, 0, 0, "time encoding this file, print MB/s"},
        {"help", PP_ARG_FLAG, &help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("tokenize", args, n, argc, argv, &positional);
    if (rc != 0 || help) {
        if (help)
            pp_args_usage("tokenize",
                          "--model PATH [--json] (TEXT | --text TEXT | --file PATH | "
                          "--bench FILE)",
                          args, n);
        return rc;
    }
    if (!text)
        text = positional;
    if (!model || (!!text + !!file + !!bench_file) != 1) {
        fprintf(stderr, "ppserve tokenize: %s\n",
                !model ? "--model is required"
                       : "give exactly one of TEXT, --text, --file and --bench");
        return 2;
    }
    struct pp_tokenizer *tok = NULL;
    if ((rc = load("tokenize", model, &tok)) != 0)
        return rc;
    if (bench_file) {
        rc = bench(tok, bench_file, json);
        pp_tokenizer_free(tok);
        return rc;
    }
    size_t len = text ? strlen(text) : 0;
    char *owned = NULL;
    if (file && !(owned = read_file(file, &len))) {
        fprintf(stderr, "ppserve tokenize: error: cannot read %s\n", file);
        pp_tokenizer_free(tok);
        return 1;
    }
    unsigned flags = (no_special ? 0u : PP_TOKENIZE_PARSE_SPECIAL) |
                     (!no_bos && pp_tokenizer_add_bos(tok) ? PP_TOKENIZE_ADD_BOS : 0u);
    int32_t *ids = NULL, n_ids = 0;
    pp_status st = pp_tokenizer_encode_ex(tok, owned ? owned : text, len, flags, &ids, &n_ids);
    if (st != PP_OK) {
        rc = pp_cli_fail("tokenize", st);
    } else if (json) {
        struct pp_json j;
        pp_json_init(&j);
        pp_json_begin_object(&j);
        pp_json_key(&j, "ids");
        pp_json_begin_array(&j);
        for (int32_t i = 0; i < n_ids; i++)
            pp_json_int(&j, ids[i]);
        pp_json_end_array(&j);
        pp_json_end_object(&j);
        printf("%s\n", j.out.data && !j.out.failed ? j.out.data : "{}");
        pp_json_free(&j);
    } else {
        for (int32_t i = 0; i < n_ids; i++)
            printf("%s%d", i ? "," : "", ids[i]);
        printf("\n");
    }
    pp_free(PP_MEM_MISC, ids);
    pp_free(PP_MEM_MISC, owned);
    pp_tokenizer_free(tok);
    return rc;
}

/* "1,2,3" (commas and/or spaces) into ids; prints the problem and returns 0 on a bad list. */
static int parse_ids(const char *s, int32_t **out, int32_t *n)
{
    size_t cap = strlen(s) / 2 + 2;
    int32_t *ids = pp_alloc(PP_MEM_MISC, cap * sizeof(int32_t));
    if (!ids)
        return 0;
    int32_t k = 0;
    for (const char *p = s; *p;) {
        if (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
            fprintf(stderr,
                    "ppserve detokenize: ids: expected non-negative integers separated by "
                    "commas, got '%s'\n",
                    s);
            pp_free(PP_MEM_MISC, ids);
            return 0;
        }
        ids[k++] = (int32_t)v;
        p = end;
    }
    *out = ids;
    *n = k;
    return 1;
}

int pp_cmd_detokenize(int argc, char **argv)
{
    const char *model = NULL, *list = NULL;
    int json = 0, help = 0;
    struct pp_arg args[] = {
        {"model", PP_ARG_STRING, &model, 0, 0, "GGUF file or HF checkpoint directory (required)"},
        {"json", PP_ARG_FLAG, &json, 0, 0, "print {\"text\":\"...\"} (invalid UTF-8 as U+FFFD)"},
        {"help", PP_ARG_FLAG, &help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("detokenize", args, n, argc, argv, &list);
    if (rc != 0 || help) {
        if (help)
            pp_args_usage("detokenize", "--model PATH [--json] 1,2,3", args, n);
        return rc;
    }
    if (!model || !list) {
        fprintf(stderr, "ppserve detokenize: %s\n",
                !model ? "--model is required" : "give the ids, e.g. 1,2,3");
        return 2;
    }
    int32_t *ids = NULL, n_ids = 0;
    if (!parse_ids(list, &ids, &n_ids))
        return 2;
    struct pp_tokenizer *tok = NULL;
    if ((rc = load("detokenize", model, &tok)) != 0) {
        pp_free(PP_MEM_MISC, ids);
        return rc;
    }
    char *text = NULL;
    size_t len = 0;
    pp_status st = pp_tokenizer_decode(tok, ids, n_ids, &text, &len);
    if (st != PP_OK) {
        rc = pp_cli_fail("detokenize", st);
    } else if (json) {
        struct pp_json j;
        pp_json_init(&j);
        pp_json_begin_object(&j);
        pp_json_key(&j, "text");
        pp_json_string(&j, text, len);
        pp_json_end_object(&j);
        printf("%s\n", j.out.data && !j.out.failed ? j.out.data : "{}");
        pp_json_free(&j);
    } else {
        fwrite(text, 1, len, stdout);
        printf("\n");
    }
    pp_free(PP_MEM_MISC, text);
    pp_free(PP_MEM_MISC, ids);
    pp_tokenizer_free(tok);
    return rc;
}
