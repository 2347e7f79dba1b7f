/* Typed configuration over libconfig. */
#include "common/config.h"

#include <errno.h>
#include <libconfig.h>

#include "common/log.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct pp_cfg_key *find_key(const struct pp_cfg_key *keys, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

static const char *type_words(const struct pp_cfg_key *k, char *buf, size_t cap)
{
    switch (k->type) {
    case PP_CFG_INT: snprintf(buf, cap, "an integer in [%.0f, %.0f]", k->min, k->max); break;
    case PP_CFG_FLOAT: snprintf(buf, cap, "a number in [%g, %g]", k->min, k->max); break;
    case PP_CFG_BOOL: snprintf(buf, cap, "true or false"); break;
    case PP_CFG_STRING:
        snprintf(buf, cap, "a string of at most %d bytes", PP_CFG_STR_MAX - 1);
        break;
    case PP_CFG_INTS:
        snprintf(buf, cap, "a list of at most %d integers in [%.0f, %.0f]", PP_CFG_INTS_MAX,
                 k->min, k->max);
        break;
    }
    return buf;
}

static pp_status bad(const struct pp_cfg_key *k, const char *where, const char *got)
{
    char words[128];
    return pp_error(PP_ERR_INVALID_ARG, "%s: key '%s': expected %s, got %s", where, k->name,
                    type_words(k, words, sizeof(words)), got);
}

static int int_ok(const struct pp_cfg_key *k, long long v)
{
    return (double)v >= k->min && (double)v <= k->max;
}

/* Stores a parsed scalar; where names the source for errors. */
static pp_status store_text(const struct pp_cfg_key *k, void *dest, const char *text,
                            const char *where)
{
    char *p = (char *)dest + k->offset;
    char *end;
    char got[300];
    snprintf(got, sizeof(got), "'%s'", text);
    errno = 0;
    switch (k->type) {
    case PP_CFG_INT: {
        long long v = strtoll(text, &end, 10);
        if (end == text || *end || errno || !int_ok(k, v))
            return bad(k, where, got);
        *(int64_t *)p = v;
        return PP_OK;
    }
    case PP_CFG_FLOAT: {
        double v = strtod(text, &end);
        if (end == text || *end || errno || !isfinite(v) || v < k->min || v > k->max)
            return bad(k, where, got);
        *(double *)p = v;
        return PP_OK;
    }
    case PP_CFG_BOOL:
        if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0)
            *(int *)p = 1;
        else if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0)
            *(int *)p = 0;
        else
            return bad(k, where, got);
        return PP_OK;
    case PP_CFG_STRING:
        if (strlen(text) >= PP_CFG_STR_MAX)
            return bad(k, where, "a longer string");
        if (k->check && k->check(text) != PP_OK)
            return pp_error(PP_ERR_INVALID_ARG, "%s: key '%s': %s", where, k->name,
                            pp_error_detail());
        snprintf(p, PP_CFG_STR_MAX, "%s", text);
        return PP_OK;
    case PP_CFG_INTS: {
        struct pp_cfg_ints l = {{0}, 0};
        const char *s = text;
        while (*s) {
            long long v = strtoll(s, &end, 10);
            if (end == s || errno || !int_ok(k, v) || l.n == PP_CFG_INTS_MAX ||
                (*end != ',' && *end != '\0'))
                return bad(k, where, got);
            l.v[l.n++] = v;
            s = *end == ',' ? end + 1 : end;
        }
        if (l.n == 0)
            return bad(k, where, got);
        *(struct pp_cfg_ints *)p = l;
        return PP_OK;
    }
    }
    return PP_ERR_INTERNAL;
}

static pp_status store_setting(const struct pp_cfg_key *k, void *dest, config_setting_t *s,
                               const char *where)
{
    char *p = (char *)dest + k->offset;
    int t = config_setting_type(s);
    switch (k->type) {
    case PP_CFG_INT:
        if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
            return bad(k, where, "a value of another type");
        if (!int_ok(k, config_setting_get_int64(s))) {
            char got[32];
            snprintf(got, sizeof(got), "%lld", (long long)config_setting_get_int64(s));
            return bad(k, where, got);
        }
        *(int64_t *)p = config_setting_get_int64(s);
        return PP_OK;
    case PP_CFG_FLOAT: {
        if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64 && t != CONFIG_TYPE_FLOAT)
            return bad(k, where, "a value of another type");
        double v = t == CONFIG_TYPE_FLOAT ? config_setting_get_float(s)
                                          : (double)config_setting_get_int64(s);
        if (v < k->min || v > k->max) {
            char got[32];
            snprintf(got, sizeof(got), "%g", v);
            return bad(k, where, got);
        }
        *(double *)p = v;
        return PP_OK;
    }
    case PP_CFG_BOOL:
        if (t != CONFIG_TYPE_BOOL)
            return bad(k, where, "a value of another type");
        *(int *)p = config_setting_get_bool(s);
        return PP_OK;
    case PP_CFG_STRING:
        if (t != CONFIG_TYPE_STRING)
            return bad(k, where, "a value of another type (strings are quoted)");
        return store_text(k, dest, config_setting_get_string(s), where);
    case PP_CFG_INTS: {
        if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST)
            return bad(k, where, "a value of another type (lists are [1, 2, 3])");
        struct pp_cfg_ints l = {{0}, 0};
        int n = config_setting_length(s);
        if (n < 1 || n > PP_CFG_INTS_MAX)
            return bad(k, where, n < 1 ? "an empty list" : "a longer list");
        for (int i = 0; i < n; i++) {
            config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
            int et = config_setting_type(e);
            if ((et != CONFIG_TYPE_INT && et != CONFIG_TYPE_INT64) ||
                !int_ok(k, config_setting_get_int64(e)))
                return bad(k, where, "a list with an element outside that");
            l.v[l.n++] = config_setting_get_int64(e);
        }
        *(struct pp_cfg_ints *)p = l;
        return PP_OK;
    }
    }
    return PP_ERR_INTERNAL;
}

pp_status pp_config_load_file(const struct pp_cfg_key *keys, int n_keys, void *dest,
                              const char *path)
{
    config_t cfg;
    config_init(&cfg);
    pp_status st = PP_OK;
    if (!config_read_file(&cfg, path)) {
        if (config_error_type(&cfg) == CONFIG_ERR_FILE_IO)
            st = pp_error(PP_ERR_IO, "%s: cannot read the configuration file", path);
        else
            st = pp_error(PP_ERR_INVALID_ARG, "%s:%d: %s", path, config_error_line(&cfg),
                          config_error_text(&cfg));
        config_destroy(&cfg);
        return st;
    }
    config_setting_t *root = config_root_setting(&cfg);
    int n = config_setting_length(root);
    for (int i = 0; i < n && st == PP_OK; i++) {
        config_setting_t *s = config_setting_get_elem(root, (unsigned)i);
        char where[512];
        snprintf(where, sizeof(where), "%s:%u", path, config_setting_source_line(s));
        const char *name = config_setting_name(s);
        const struct pp_cfg_key *k = name ? find_key(keys, n_keys, name) : NULL;
        if (!k)
            st = pp_error(PP_ERR_INVALID_ARG, "%s: unknown key '%s'", where, name ? name : "?");
        else
            st = store_setting(k, dest, s, where);
    }
    config_destroy(&cfg);
    return st;
}

pp_status pp_config_set(const struct pp_cfg_key *keys, int n_keys, void *dest, const char *name,
                        const char *value, const char *source)
{
    const struct pp_cfg_key *k = find_key(keys, n_keys, name);
    if (!k)
        return pp_error(PP_ERR_INVALID_ARG, "%s: unknown key '%s'", source, name);
    return store_text(k, dest, value, source);
}

pp_status pp_config_from_args(const struct pp_cfg_key *keys, int n_keys, void *dest, int argc,
                              char **argv)
{
    pp_status st;
    for (int i = 0; i < argc; i++) /* the file first, so flags override it */
        if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0) {
            const char *path =
                argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[i + 1] : NULL);
            if (!path)
                return pp_error(PP_ERR_INVALID_ARG, "--config needs a file path");
            if ((st = pp_config_load_file(keys, n_keys, dest, path)) != PP_OK)
                return st;
        }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            return pp_error(PP_ERR_INVALID_ARG, "unexpected argument '%s'", a);
        char name[128];
        const char *eq = strchr(a + 2, '=');
        size_t nl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (nl >= sizeof(name))
            return pp_error(PP_ERR_INVALID_ARG, "flag '%s' is too long", a);
        memcpy(name, a + 2, nl);
        name[nl] = '\0';
        const char *value = eq ? eq + 1 : NULL;
        if (!value) {
            const struct pp_cfg_key *k = find_key(keys, n_keys, name);
            if (k && k->type == PP_CFG_BOOL &&
                (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0))
                value = "true"; /* a bare boolean flag */
            else if (i + 1 < argc)
                value = argv[++i];
            else
                return pp_error(PP_ERR_INVALID_ARG, "--%s needs a value", name);
        }
        if (strcmp(name, "config") == 0)
            continue;
        char source[160];
        snprintf(source, sizeof(source), "--%s", name);
        if ((st = pp_config_set(keys, n_keys, dest, name, value, source)) != PP_OK)
            return st;
    }
    return PP_OK;
}

void pp_config_usage(const struct pp_cfg_key *keys, int n_keys, const void *dest)
{
    for (int i = 0; i < n_keys; i++) {
        const struct pp_cfg_key *k = &keys[i];
        const char *p = (const char *)dest + k->offset;
        char cur[300] = "";
        switch (k->type) {
        case PP_CFG_INT: snprintf(cur, sizeof(cur), "%lld", (long long)*(const int64_t *)p); break;
        case PP_CFG_FLOAT: snprintf(cur, sizeof(cur), "%g", *(const double *)p); break;
        case PP_CFG_BOOL:
            snprintf(cur, sizeof(cur), "%s", *(const int *)p ? "true" : "false");
            break;
        case PP_CFG_STRING: snprintf(cur, sizeof(cur), "\"%s\"", p); break;
        case PP_CFG_INTS: {
            const struct pp_cfg_ints *l = (const void *)p;
            size_t n = 0;
            for (int j = 0; j < l->n && n < sizeof(cur) - 24; j++)
                n += (size_t)snprintf(cur + n, sizeof(cur) - n, "%s%lld", j ? "," : "",
                                      (long long)l->v[j]);
            break;
        }
        }
        printf("  --%-22s %s (now %s)\n", k->name, k->help, cur);
    }
}

pp_status pp_config_check_address(const char *key, const char *value)
{
    const char *colon = strrchr(value, ':');
    if (!colon || colon == value || !colon[1])
        return pp_error(PP_ERR_INVALID_ARG, "key '%s': expected host:port, got '%s'", key, value);
    return PP_OK;
}

pp_status pp_config_check_log_level(const char *key, const char *value)
{
    if (pp_log_level_parse(value) < 0)
        return pp_error(PP_ERR_INVALID_ARG,
                        "key '%s': expected debug, info, warn or error, got '%s'", key, value);
    return PP_OK;
}
