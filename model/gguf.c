/* GGUF parsing with a bounds-checked cursor: every read checks the bytes remain, so a truncated or
 * corrupt file ends in a message that says what was expected where, never in a fault. */
#include "model/gguf.h"

#include <string.h>

#include "common/alloc.h"

#define GGUF_MAGIC 0x46554747u
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_ARRAY_DEPTH 1

struct cursor {
    const uint8_t *p;
    const uint8_t *end;
    const uint8_t *base;
    const char *path;
};

static pp_status need(struct cursor *c, uint64_t n, const char *what)
{
    if ((uint64_t)(c->end - c->p) < n)
        return pp_error(PP_ERR_FORMAT,
                        "%s: truncated at byte %lld reading %s (needs %llu bytes, %lld remain)",
                        c->path, (long long)(c->p - c->base), what, (unsigned long long)n,
                        (long long)(c->end - c->p));
    return PP_OK;
}

static pp_status read_u32(struct cursor *c, uint32_t *v, const char *what)
{
    pp_status st = need(c, 4, what);
    if (st == PP_OK) {
        memcpy(v, c->p, 4);
        c->p += 4;
    }
    return st;
}

static pp_status read_u64(struct cursor *c, uint64_t *v, const char *what)
{
    pp_status st = need(c, 8, what);
    if (st == PP_OK) {
        memcpy(v, c->p, 8);
        c->p += 8;
    }
    return st;
}

static pp_status read_str(struct cursor *c, struct pp_gguf_str *s, const char *what)
{
    uint64_t len;
    pp_status st = read_u64(c, &len, what);
    if (st != PP_OK)
        return st;
    if ((st = need(c, len, what)) != PP_OK)
        return st;
    s->ptr = (const char *)c->p;
    s->len = len;
    c->p += len;
    return PP_OK;
}

static int type_size(enum pp_gguf_type t)
{
    static const int sizes[PP_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return (unsigned)t < PP_GGUF_TYPE_COUNT ? sizes[t] : -1;
}

static int str_eq(struct pp_gguf_str s, const char *z)
{
    size_t n = strlen(z);
    return s.len == n && memcmp(s.ptr, z, n) == 0;
}

/* Skips one value of type t (validating it) at the cursor. */
static pp_status skip_value(struct cursor *c, struct pp_gguf_kv *kv, enum pp_gguf_type t, int depth)
{
    if ((unsigned)t >= PP_GGUF_TYPE_COUNT)
        return pp_error(PP_ERR_FORMAT, "%s: metadata key %.*s has unknown value type %u", c->path,
                        (int)kv->key.len, kv->key.ptr, (unsigned)t);
    if (t == PP_GGUF_STRING) {
        struct pp_gguf_str s;
        return read_str(c, &s, "a string value");
    }
    if (t == PP_GGUF_ARRAY) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH)
            return pp_error(PP_ERR_FORMAT, "%s: metadata key %.*s nests arrays", c->path,
                            (int)kv->key.len, kv->key.ptr);
        uint32_t et;
        uint64_t count;
        pp_status st = read_u32(c, &et, "an array element type");
        if (st == PP_OK)
            st = read_u64(c, &count, "an array length");
        if (st != PP_OK)
            return st;
        kv->arr_type = (enum pp_gguf_type)et;
        kv->arr_count = count;
        kv->value = c->p;
        int es = type_size((enum pp_gguf_type)et);
        if (es > 0) {
            if (count > UINT64_MAX / (uint64_t)es)
                return pp_error(PP_ERR_FORMAT, "%s: array %.*s is too long", c->path,
                                (int)kv->key.len, kv->key.ptr);
            if ((st = need(c, count * (uint64_t)es, "array elements")) != PP_OK)
                return st;
            c->p += count * (uint64_t)es;
            return PP_OK;
        }
        for (uint64_t i = 0; i < count; i++)
            if ((st = skip_value(c, kv, (enum pp_gguf_type)et, depth + 1)) != PP_OK)
                return st;
        kv->arr_type = (enum pp_gguf_type)et;
        kv->arr_count = count;
        return PP_OK;
    }
    pp_status st = need(c, (uint64_t)type_size(t), "a metadata value");
    if (st == PP_OK)
        c->p += type_size(t);
    return st;
}

static pp_status ggml_type_to_dtype(uint32_t ggml, enum pp_dtype *out)
{
    switch (ggml) {
    case 0: *out = PP_DTYPE_F32; return PP_OK;
    case 1: *out = PP_DTYPE_F16; return PP_OK;
    case 8: *out = PP_DTYPE_Q8_0; return PP_OK;
    case 30: *out = PP_DTYPE_BF16; return PP_OK;
    default: return PP_ERR_UNSUPPORTED;
    }
}

static pp_status parse_tensors(struct pp_gguf *g, struct cursor *c)
{
    pp_status st;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct pp_gguf_tensor_info *ti = &g->tensors[i];
        uint32_t n_dims, ggml_type;
        if ((st = read_str(c, &ti->name, "a tensor name")) != PP_OK ||
            (st = read_u32(c, &n_dims, "a tensor's dimension count")) != PP_OK)
            return st;
        if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
            return pp_error(PP_ERR_FORMAT, "%s: tensor %.*s has %u dimensions (expected 1..%d)",
                            g->path, (int)ti->name.len, ti->name.ptr, n_dims, GGUF_MAX_DIMS);
        uint64_t dims[GGUF_MAX_DIMS];
        uint64_t elems = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            if ((st = read_u64(c, &dims[d], "a tensor dimension")) != PP_OK)
                return st;
            if (dims[d] == 0 || dims[d] > ((uint64_t)1 << 40) ||
                elems > ((uint64_t)1 << 50) / dims[d])
                return pp_error(PP_ERR_FORMAT, "%s: tensor %.*s has an invalid dimension %llu",
                                g->path, (int)ti->name.len, ti->name.ptr,
                                (unsigned long long)dims[d]);
            elems *= dims[d];
        }
        uint64_t offset;
        if ((st = read_u32(c, &ggml_type, "a tensor type")) != PP_OK ||
            (st = read_u64(c, &offset, "a tensor offset")) != PP_OK)
            return st;
        if (ggml_type_to_dtype(ggml_type, &ti->t.dtype) != PP_OK)
            return pp_error(
                PP_ERR_UNSUPPORTED,
                "%s: tensor %.*s has ggml type %u (supported: F32=0, F16=1, Q8_0=8, BF16=30)",
                g->path, (int)ti->name.len, ti->name.ptr, ggml_type);
        ti->t.n_dims = (int32_t)n_dims;
        for (uint32_t d = 0; d < n_dims; d++)
            ti->t.shape[d] = (int64_t)dims[n_dims - 1 - d];
        if (offset % g->alignment != 0)
            return pp_error(PP_ERR_FORMAT,
                            "%s: tensor %.*s offset %llu is not a multiple of the alignment %llu",
                            g->path, (int)ti->name.len, ti->name.ptr, (unsigned long long)offset,
                            (unsigned long long)g->alignment);
        /* made absolute once the data start is known */
        ti->t.data = (const void *)(uintptr_t)offset;
        if (ti->t.dtype == PP_DTYPE_Q8_0 && dims[0] % PP_Q8_0_BLOCK != 0)
            return pp_error(
                PP_ERR_FORMAT,
                "%s: Q8_0 tensor %.*s has a row length %llu that is not a multiple of 32", g->path,
                (int)ti->name.len, ti->name.ptr, (unsigned long long)dims[0]);
    }
    return PP_OK;
}

static pp_status place_tensors(struct pp_gguf *g, uint64_t data_start)
{
    uint64_t data_size = (uint64_t)g->file.size - data_start;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct pp_gguf_tensor_info *ti = &g->tensors[i];
        uint64_t offset = (uint64_t)(uintptr_t)ti->t.data;
        int64_t rows = pp_tensor_elems(&ti->t) / ti->t.shape[ti->t.n_dims - 1];
        uint64_t bytes = (uint64_t)rows *
                         (uint64_t)pp_dtype_row_bytes(ti->t.dtype, ti->t.shape[ti->t.n_dims - 1]);
        if (offset > data_size || bytes > data_size - offset)
            return pp_error(PP_ERR_FORMAT,
                            "%s: tensor %.*s needs bytes [%llu, %llu) of the data section, which "
                            "has %llu bytes (file truncated?)",
                            g->path, (int)ti->name.len, ti->name.ptr,
                            (unsigned long long)offset, (unsigned long long)(offset + bytes),
                            (unsigned long long)data_size);
        ti->t.data = g->file.data + data_start + offset;
    }
    return PP_OK;
}

static pp_status parse(struct pp_gguf *g)
{
    if (g->file.size < 4) /* also keeps an empty file's NULL map out of the cursor */
        return pp_error(PP_ERR_FORMAT, "%s: %lld bytes is too short for a GGUF file", g->path,
                        (long long)g->file.size);
    struct cursor c = {g->file.data, g->file.data + g->file.size, g->file.data, g->path};
    uint32_t magic;
    uint64_t n_tensors, n_kv;
    pp_status st;
    if ((st = read_u32(&c, &magic, "the magic")) != PP_OK)
        return st;
    if (magic != GGUF_MAGIC)
        return pp_error(PP_ERR_FORMAT,
                        "%s: not a GGUF file (magic 0x%08x, expected 0x%08x \"GGUF\")", g->path,
                        magic, GGUF_MAGIC);
    if ((st = read_u32(&c, &g->version, "the version")) != PP_OK ||
        (st = read_u64(&c, &n_tensors, "the tensor count")) != PP_OK ||
        (st = read_u64(&c, &n_kv, "the metadata count")) != PP_OK)
        return st;
    if (g->version != 2 && g->version != 3)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: GGUF version %u (supported: 2, 3)", g->path,
                        g->version);
    /* each entry takes at least 8 bytes (its name's length), a bound that rejects absurd counts */
    if (n_tensors > (uint64_t)g->file.size / 8 || n_kv > (uint64_t)g->file.size / 8)
        return pp_error(PP_ERR_FORMAT,
                        "%s: header claims %llu tensors and %llu metadata keys, more "
                        "than a %lld-byte file can hold",
                        g->path, (unsigned long long)n_tensors, (unsigned long long)n_kv,
                        (long long)g->file.size);
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kv = pp_calloc(PP_MEM_MISC, n_kv ? n_kv : 1, sizeof(*g->kv));
    g->tensors = pp_calloc(PP_MEM_MISC, n_tensors ? n_tensors : 1, sizeof(*g->tensors));
    if (!g->kv || !g->tensors)
        return PP_ERR_NOMEM;
    for (int64_t i = 0; i < g->n_kv; i++) {
        struct pp_gguf_kv *kv = &g->kv[i];
        uint32_t t;
        if ((st = read_str(&c, &kv->key, "a metadata key")) != PP_OK ||
            (st = read_u32(&c, &t, "a metadata type")) != PP_OK)
            return st;
        kv->type = (enum pp_gguf_type)t;
        kv->value = c.p;
        if ((st = skip_value(&c, kv, kv->type, 0)) != PP_OK)
            return st; /* for arrays skip_value pointed kv->value at the first element */
    }
    g->alignment = 32;
    const struct pp_gguf_kv *al = pp_gguf_find(g, "general.alignment");
    if (al) {
        int64_t a;
        if ((st = pp_gguf_get_i64(g, "general.alignment", &a)) != PP_OK)
            return st;
        if (a <= 0 || (a & (a - 1)) != 0 || a > 65536)
            return pp_error(PP_ERR_FORMAT,
                            "%s: general.alignment %lld is not a power of two <= 65536", g->path,
                            (long long)a);
        g->alignment = (uint64_t)a;
    }
    if ((st = parse_tensors(g, &c)) != PP_OK)
        return st;
    uint64_t pos = (uint64_t)(c.p - c.base);
    uint64_t data_start = (pos + g->alignment - 1) / g->alignment * g->alignment;
    if (data_start > (uint64_t)g->file.size)
        data_start = (uint64_t)g->file.size;
    return place_tensors(g, data_start);
}

pp_status pp_gguf_open(const char *path, struct pp_gguf **out)
{
    struct pp_gguf *g = pp_calloc(PP_MEM_MISC, 1, sizeof(*g));
    if (!g)
        return PP_ERR_NOMEM;
    if (!(g->path = pp_strdup(PP_MEM_MISC, path))) {
        pp_free(PP_MEM_MISC, g);
        return PP_ERR_NOMEM;
    }
    pp_status st = pp_mapped_file_open(path, &g->file);
    if (st == PP_OK)
        st = parse(g);
    if (st != PP_OK) {
        pp_gguf_free(g);
        return st;
    }
    *out = g;
    return PP_OK;
}

void pp_gguf_free(struct pp_gguf *g)
{
    if (!g)
        return;
    pp_mapped_file_close(&g->file);
    pp_free(PP_MEM_MISC, g->kv);
    pp_free(PP_MEM_MISC, g->tensors);
    pp_free(PP_MEM_MISC, (char *)g->path);
    pp_free(PP_MEM_MISC, g);
}

const struct pp_gguf_kv *pp_gguf_find(const struct pp_gguf *g, const char *key)
{
    for (int64_t i = 0; i < g->n_kv; i++)
        if (str_eq(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

pp_status pp_gguf_get_i64(const struct pp_gguf *g, const char *key, int64_t *out)
{
    const struct pp_gguf_kv *kv = pp_gguf_find(g, key);
    if (!kv)
        return PP_ERR_NOT_FOUND;
    const uint8_t *v = kv->value;
    switch (kv->type) {
    case PP_GGUF_U8: *out = *v; return PP_OK;
    case PP_GGUF_I8: *out = (int8_t)*v; return PP_OK;
    case PP_GGUF_U16: { uint16_t x; memcpy(&x, v, 2); *out = x; return PP_OK; }
    case PP_GGUF_I16: { int16_t x; memcpy(&x, v, 2); *out = x; return PP_OK; }
    case PP_GGUF_U32: { uint32_t x; memcpy(&x, v, 4); *out = x; return PP_OK; }
    case PP_GGUF_I32: { int32_t x; memcpy(&x, v, 4); *out = x; return PP_OK; }
    case PP_GGUF_I64: { int64_t x; memcpy(&x, v, 8); *out = x; return PP_OK; }
    case PP_GGUF_U64: {
        uint64_t x;
        memcpy(&x, v, 8);
        if (x > INT64_MAX)
            break;
        *out = (int64_t)x;
        return PP_OK;
    }
    default: break;
    }
    return pp_error(PP_ERR_FORMAT, "%s: metadata %s: expected an integer, got type %d", g->path,
                    key, (int)kv->type);
}

pp_status pp_gguf_get_f32(const struct pp_gguf *g, const char *key, float *out)
{
    const struct pp_gguf_kv *kv = pp_gguf_find(g, key);
    if (!kv)
        return PP_ERR_NOT_FOUND;
    if (kv->type == PP_GGUF_F32) {
        memcpy(out, kv->value, 4);
        return PP_OK;
    }
    if (kv->type == PP_GGUF_F64) {
        double d;
        memcpy(&d, kv->value, 8);
        *out = (float)d;
        return PP_OK;
    }
    int64_t i;
    if (pp_gguf_get_i64(g, key, &i) == PP_OK) {
        *out = (float)i;
        return PP_OK;
    }
    return pp_error(PP_ERR_FORMAT, "%s: metadata %s: expected a number, got type %d", g->path, key,
                    (int)kv->type);
}

pp_status pp_gguf_get_bool(const struct pp_gguf *g, const char *key, int *out)
{
    const struct pp_gguf_kv *kv = pp_gguf_find(g, key);
    if (!kv)
        return PP_ERR_NOT_FOUND;
    if (kv->type != PP_GGUF_BOOL)
        return pp_error(PP_ERR_FORMAT, "%s: metadata %s: expected a bool, got type %d", g->path,
                        key, (int)kv->type);
    *out = kv->value[0] != 0;
    return PP_OK;
}

pp_status pp_gguf_get_str(const struct pp_gguf *g, const char *key, struct pp_gguf_str *out)
{
    const struct pp_gguf_kv *kv = pp_gguf_find(g, key);
    if (!kv)
        return PP_ERR_NOT_FOUND;
    if (kv->type != PP_GGUF_STRING)
        return pp_error(PP_ERR_FORMAT, "%s: metadata %s: expected a string, got type %d", g->path,
                        key, (int)kv->type);
    uint64_t len;
    memcpy(&len, kv->value, 8);
    out->ptr = (const char *)kv->value + 8;
    out->len = len;
    return PP_OK;
}

void pp_gguf_arr_strings(const struct pp_gguf_kv *kv, struct pp_gguf_str *out)
{
    const uint8_t *p = kv->value;
    for (uint64_t i = 0; i < kv->arr_count; i++) {
        uint64_t len;
        memcpy(&len, p, 8);
        out[i].ptr = (const char *)p + 8;
        out[i].len = len;
        p += 8 + len;
    }
}

const struct pp_tensor *pp_gguf_tensor(const struct pp_gguf *g, const char *name)
{
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name))
            return &g->tensors[i].t;
    return NULL;
}
