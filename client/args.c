/* Flag parsing for the CLI. */
#include "client/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

static int parse_ids(const char *cmd, const char *name, const char *v, struct pp_id_list *out)
{
    int32_t cap = 1;
    for (const char *p = v; *p; p++)
        cap += *p == ',';
    int32_t *ids = pp_alloc(PP_MEM_MISC, (size_t)cap * sizeof(int32_t));
    if (!ids)
        return -1;
    int32_t n = 0;
    const char *p = v;
    while (*p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "ppserve %s: --%s: expected comma-separated token ids (integers >= 0), "
                    "got '%s'\n", cmd, name, v);
            pp_free(PP_MEM_MISC, ids);
            return -1;
        }
        ids[n++] = (int32_t)x;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0') {
            fprintf(stderr, "ppserve %s: --%s: trailing comma in '%s'\n", cmd, name, v);
            pp_free(PP_MEM_MISC, ids);
            return -1;
        }
    }
    if (n == 0) {
        fprintf(stderr, "ppserve %s: --%s: expected at least one token id\n", cmd, name);
        pp_free(PP_MEM_MISC, ids);
        return -1;
    }
    pp_free(PP_MEM_MISC, out->ids);
    out->ids = ids;
    out->n = n;
    return 0;
}

static int set_value(const char *cmd, struct pp_arg *a, const char *v)
{
    char *end;
    errno = 0;
    switch (a->type) {
    case PP_ARG_STRING:
        *(const char **)a->dest = v;
        return 0;
    case PP_ARG_STRINGS: {
        struct pp_str_list *l = a->dest;
        if (l->n >= PP_ARGS_MAX_STRINGS) {
            fprintf(stderr, "ppserve %s: --%s: at most %d allowed\n", cmd, a->name,
                    PP_ARGS_MAX_STRINGS);
            return -1;
        }
        l->items[l->n++] = v;
        return 0;
    }
    case PP_ARG_INT: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno || x < (long long)a->min || x > (long long)a->max) {
            fprintf(stderr, "ppserve %s: --%s: expected an integer in [%.0f, %.0f], got '%s'\n",
                    cmd, a->name, a->min, a->max, v);
            return -1;
        }
        *(int32_t *)a->dest = (int32_t)x;
        return 0;
    }
    case PP_ARG_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end || errno || v[0] == '-') {
            fprintf(stderr, "ppserve %s: --%s: expected an unsigned 64-bit integer, got '%s'\n",
                    cmd, a->name, v);
            return -1;
        }
        *(uint64_t *)a->dest = x;
        return 0;
    }
    case PP_ARG_FLOAT: {
        double x = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(x) || x < a->min || x > a->max) {
            fprintf(stderr, "ppserve %s: --%s: expected a number in [%g, %g], got '%s'\n", cmd,
                    a->name, a->min, a->max, v);
            return -1;
        }
        *(float *)a->dest = (float)x;
        return 0;
    }
    case PP_ARG_IDS:
        return parse_ids(cmd, a->name, v, a->dest);
    case PP_ARG_FLAG:
        break;
    }
    return -1;
}

int pp_args_parse(const char *cmd, struct pp_arg *args, int n, int argc, char **argv,
                  const char **positional)
{
    int have_positional = 0;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (strncmp(s, "--", 2) != 0) {
            if (positional && !have_positional) {
                *positional = s;
                have_positional = 1;
                continue;
            }
            fprintf(stderr, "ppserve %s: unexpected argument '%s' (see ppserve %s --help)\n", cmd,
                    s, cmd);
            return 2;
        }
        const char *name = s + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        struct pp_arg *a = NULL;
        for (int k = 0; k < n && !a; k++)
            if (strlen(args[k].name) == nlen && strncmp(args[k].name, name, nlen) == 0)
                a = &args[k];
        if (!a) {
            fprintf(stderr, "ppserve %s: unknown flag '--%.*s' (see ppserve %s --help)\n", cmd,
                    (int)nlen, name, cmd);
            return 2;
        }
        a->seen = 1;
        if (a->type == PP_ARG_FLAG) {
            if (eq) {
                fprintf(stderr, "ppserve %s: --%s takes no value\n", cmd, a->name);
                return 2;
            }
            *(int *)a->dest = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ppserve %s: --%s needs a value\n", cmd, a->name);
                return 2;
            }
            v = argv[++i];
        }
        if (set_value(cmd, a, v) != 0)
            return 2;
    }
    return 0;
}

void pp_args_usage(const char *cmd, const char *synopsis, const struct pp_arg *args, int n)
{
    printf("usage: ppserve %s %s\n\n", cmd, synopsis);
    for (int i = 0; i < n; i++) {
        char left[64];
        const char *meta = args[i].type == PP_ARG_FLAG ? "" : args[i].type == PP_ARG_IDS ? " 1,2,3"
                           : args[i].type == PP_ARG_INT || args[i].type == PP_ARG_U64 ? " N"
                           : args[i].type == PP_ARG_FLOAT ? " X" : " VALUE";
        snprintf(left, sizeof(left), "--%s%s", args[i].name, meta);
        printf("  %-24s %s\n", left, args[i].help);
    }
}

int pp_args_seen(const struct pp_arg *args, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(args[i].name, name) == 0)
            return args[i].seen;
    return 0;
}

void pp_id_list_free(struct pp_id_list *l)
{
    pp_free(PP_MEM_MISC, l->ids);
    l->ids = NULL;
    l->n = 0;
}
