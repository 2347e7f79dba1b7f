/* Device selection's text form: parsing "auto" | "cpu" | "cuda:N[,N...]" into a device spec, and
 * writing one back. No device is queried here (kernels/devices.c resolves a spec on the host), so
 * configuration code needs nothing else of the kernels. */
#include "kernels/devices.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ID 1023

static const char *const expected_form =
    "expected \"auto\", \"cpu\" or \"cuda:N[,N...]\" (N a CUDA device id)";

static pp_status parse_ids(const char *text, struct pp_device_spec *out)
{
    const char *p = text + 5; /* after "cuda:" */
    if (!*p)
        return pp_error(PP_ERR_INVALID_ARG, "expected device ids after \"cuda:\" (e.g. cuda:0 or "
                        "cuda:0,1), got '%s'", text);
    for (;;) {
        if (*p < '0' || *p > '9')
            return pp_error(PP_ERR_INVALID_ARG, "expected device ids (numbers 0..%d) separated by "
                            "commas after \"cuda:\", got '%s'", MAX_ID, text);
        char *end;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (errno || id > MAX_ID)
            return pp_error(PP_ERR_INVALID_ARG, "expected device ids 0..%d, got '%s'", MAX_ID,
                            text);
        for (int i = 0; i < out->n; i++)
            if (out->ids[i] == (int)id)
                return pp_error(PP_ERR_INVALID_ARG, "expected distinct device ids, got '%s' "
                                "(cuda:%ld twice)", text, id);
        if (out->n == PP_DEVICES_MAX)
            return pp_error(PP_ERR_INVALID_ARG, "expected at most %d device ids, got '%s'",
                            PP_DEVICES_MAX, text);
        out->ids[out->n++] = (int)id;
        if (*end == '\0')
            return PP_OK;
        if (*end != ',')
            return pp_error(PP_ERR_INVALID_ARG, "expected device ids (numbers 0..%d) separated by "
                            "commas after \"cuda:\", got '%s'", MAX_ID, text);
        p = end + 1;
    }
}

pp_status pp_device_spec_parse(const char *text, struct pp_device_spec *out)
{
    memset(out, 0, sizeof(*out));
    if (!text || !*text)
        return pp_error(PP_ERR_INVALID_ARG, "%s, got an empty value", expected_form);
    if (strcmp(text, "auto") == 0) {
        out->kind = PP_DEVICE_AUTO;
        return PP_OK;
    }
    if (strcmp(text, "cpu") == 0) {
        out->kind = PP_DEVICE_CPU;
        return PP_OK;
    }
    if (strncmp(text, "cuda:", 5) == 0) {
        out->kind = PP_DEVICE_CUDA;
        pp_status st = parse_ids(text, out);
        if (st != PP_OK)
            memset(out, 0, sizeof(*out));
        return st;
    }
    if (strcmp(text, "cuda") == 0)
        return pp_error(PP_ERR_INVALID_ARG, "expected device ids after \"cuda:\" (e.g. cuda:0 or "
                        "cuda:0,1), got 'cuda'");
    return pp_error(PP_ERR_INVALID_ARG, "%s, got '%s'", expected_form, text);
}

pp_status pp_device_spec_check(const char *text)
{
    struct pp_device_spec s;
    return pp_device_spec_parse(text, &s);
}

void pp_device_spec_format(const struct pp_device_spec *s, char *buf, size_t cap)
{
    if (cap == 0)
        return;
    if (s->kind != PP_DEVICE_CUDA) {
        snprintf(buf, cap, "%s", s->kind == PP_DEVICE_CPU ? "cpu" : "auto");
        return;
    }
    size_t n = (size_t)snprintf(buf, cap, "cuda:");
    for (int i = 0; i < s->n && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? "," : "", s->ids[i]);
}
