/* safetensors header parsing. Every offset pair is checked against the data section and against the
 * byte count its dtype and shape imply, so a corrupt header ends in a message, never a bad read. */
#include "model/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"

#define MAX_HEADER (100 * 1024 * 1024)

static int dtype_of(const char *name, enum pp_dtype *out)
{
    if (strcmp(name, "F32") == 0)
        *out = PP_DTYPE_F32;
    else if (strcmp(name, "F16") == 0)
        *out = PP_DTYPE_F16;
    else if (strcmp(name, "BF16") == 0)
        *out = PP_DTYPE_BF16;
    else
        return 0;
    return 1;
}

static pp_status parse_entry(struct pp_safetensors *s, const char *name, json_t *v,
                             const uint8_t *data, uint64_t data_size,
                             struct pp_safetensors_entry *e)
{
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) ||
        json_array_size(offs) != 2)
        return pp_error(PP_ERR_FORMAT,
                        "%s: tensor %s: expected {\"dtype\": string, \"shape\": [..], "
                        "\"data_offsets\": [begin, end]}",
                        s->path, name);
    if (!(e->name = pp_strdup(PP_MEM_MISC, name)))
        return PP_ERR_NOMEM;
    snprintf(e->dtype_name, sizeof(e->dtype_name), "%s", json_string_value(dt));
    e->supported = dtype_of(e->dtype_name, &e->t.dtype);
    size_t nd = json_array_size(shape);
    if (nd > PP_TENSOR_MAX_DIMS)
        return pp_error(PP_ERR_FORMAT, "%s: tensor %s has %zu dimensions (at most %d supported)",
                        s->path, name, nd, PP_TENSOR_MAX_DIMS);
    e->t.n_dims = (int32_t)nd;
    uint64_t elems = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 ||
            json_integer_value(d) > ((json_int_t)1 << 40))
            return pp_error(PP_ERR_FORMAT, "%s: tensor %s: shape[%zu] is not a valid size",
                            s->path, name, i);
        e->t.shape[i] = json_integer_value(d);
        /* checked before multiplying, so the count cannot wrap */
        if (e->t.shape[i] != 0 && elems > ((uint64_t)1 << 50) / (uint64_t)e->t.shape[i])
            return pp_error(PP_ERR_FORMAT, "%s: tensor %s is too large", s->path, name);
        elems *= (uint64_t)e->t.shape[i];
    }
    json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b) ||
        (uint64_t)json_integer_value(en) > data_size)
        return pp_error(PP_ERR_FORMAT,
                        "%s: tensor %s: data_offsets must satisfy 0 <= begin <= end <= %llu "
                        "(the data section; file truncated?)",
                        s->path, name, (unsigned long long)data_size);
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(en);
    if (e->supported) {
        uint64_t want = elems * (e->t.dtype == PP_DTYPE_F32 ? 4 : 2);
        if (end - begin != want)
            return pp_error(PP_ERR_FORMAT,
                            "%s: tensor %s: %s of shape with %llu elements needs %llu bytes, "
                            "data_offsets span %llu",
                            s->path, name, e->dtype_name, (unsigned long long)elems,
                            (unsigned long long)want, (unsigned long long)(end - begin));
    }
    e->t.data = data + begin;
    return PP_OK;
}

static pp_status parse(struct pp_safetensors *s)
{
    if (s->file.size < 8)
        return pp_error(PP_ERR_FORMAT, "%s: %lld bytes is too short for safetensors (8-byte header "
                        "length expected)", s->path, (long long)s->file.size);
    uint64_t hlen;
    memcpy(&hlen, s->file.data, 8);
    if (hlen > MAX_HEADER || hlen > (uint64_t)s->file.size - 8)
        return pp_error(PP_ERR_FORMAT,
                        "%s: header length %llu exceeds the file (%lld bytes) or the %d-byte limit",
                        s->path, (unsigned long long)hlen, (long long)s->file.size, MAX_HEADER);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)s->file.data + 8, hlen, 0, &jerr);
    if (!root)
        return pp_error(PP_ERR_FORMAT, "%s: header is not valid JSON: %s (position %d)", s->path,
                        jerr.text, jerr.position);
    pp_status st = PP_OK;
    if (!json_is_object(root)) {
        st = pp_error(PP_ERR_FORMAT, "%s: header is not a JSON object", s->path);
        goto done;
    }
    const uint8_t *data = s->file.data + 8 + hlen;
    uint64_t data_size = (uint64_t)s->file.size - 8 - hlen;
    s->entries = pp_calloc(PP_MEM_MISC, json_object_size(root) + 1, sizeof(*s->entries));
    if (!s->entries) {
        st = PP_ERR_NOMEM;
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        if (!json_is_object(v)) {
            st = pp_error(PP_ERR_FORMAT, "%s: entry %s is not an object", s->path, key);
            goto done;
        }
        if ((st = parse_entry(s, key, v, data, data_size, &s->entries[s->n])) != PP_OK) {
            s->n++; /* so its name is freed */
            goto done;
        }
        s->n++;
    }
done:
    json_decref(root);
    return st;
}

pp_status pp_safetensors_open(const char *path, struct pp_safetensors **out)
{
    struct pp_safetensors *s = pp_calloc(PP_MEM_MISC, 1, sizeof(*s));
    if (!s)
        return PP_ERR_NOMEM;
    s->path = pp_strdup(PP_MEM_MISC, path);
    pp_status st = s->path ? pp_mapped_file_open(path, &s->file) : PP_ERR_NOMEM;
    if (st == PP_OK)
        st = parse(s);
    if (st != PP_OK) {
        pp_safetensors_free(s);
        return st;
    }
    *out = s;
    return PP_OK;
}

void pp_safetensors_free(struct pp_safetensors *s)
{
    if (!s)
        return;
    for (int64_t i = 0; i < s->n; i++)
        pp_free(PP_MEM_MISC, s->entries[i].name);
    pp_free(PP_MEM_MISC, s->entries);
    pp_mapped_file_close(&s->file);
    pp_free(PP_MEM_MISC, s->path);
    pp_free(PP_MEM_MISC, s);
}

const struct pp_safetensors_entry *pp_safetensors_find(const struct pp_safetensors *s,
                                                      const char *name)
{
    for (int64_t i = 0; i < s->n; i++)
        if (strcmp(s->entries[i].name, name) == 0)
            return &s->entries[i];
    return NULL;
}
