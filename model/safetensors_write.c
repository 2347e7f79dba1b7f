/* A safetensors writer: tensors are declared first, then the header (u64 length + JSON with dtype,
 * shape and data_offsets per tensor and "__metadata__": {"format": "pt"}, padded with spaces to a
 * multiple of 8) goes out and the tensors' bytes are streamed in declaration order, unpadded. */
#include <string.h>

#include "common/alloc.h"
#include "model/synth-impl.h"

#define HEADER_ALIGN 8

const char *pp__st_dtype_name(enum pp_dtype t)
{
    switch (t) {
    case PP_DTYPE_F32:
        return "F32";
    case PP_DTYPE_F16:
        return "F16";
    case PP_DTYPE_BF16:
        return "BF16";
    default:
        return NULL;
    }
}

void pp__st_init(struct pp__st_writer *w)
{
    memset(w, 0, sizeof(*w));
}

pp_status pp__st_add(struct pp__st_writer *w, const char *name, enum pp_dtype type, int n_dims,
                     const int64_t *shape)
{
    if (!pp__st_dtype_name(type))
        return pp_error(PP_ERR_INVALID_ARG,
                        "safetensors writer: tensor %s: dtype %s has no "
                        "safetensors form",
                        name, pp_dtype_name(type));
    if (n_dims < 1 || n_dims > 2 || strlen(name) >= sizeof(w->entries->name))
        return pp_error(PP_ERR_INTERNAL, "safetensors writer: tensor %s: bad name or shape", name);
    if (w->n == w->cap) {
        uint64_t cap = w->cap ? 2 * w->cap : 64;
        struct pp__st_entry *e = pp_alloc(PP_MEM_MISC, (size_t)cap * sizeof(*e));
        if (!e)
            return pp_error(PP_ERR_NOMEM, "safetensors writer: no memory for tensor entries");
        if (w->n)
            memcpy(e, w->entries, (size_t)w->n * sizeof(*e));
        pp_free(PP_MEM_MISC, w->entries);
        w->entries = e;
        w->cap = cap;
    }
    struct pp__st_entry *e = &w->entries[w->n++];
    memset(e, 0, sizeof(*e));
    strcpy(e->name, name);
    e->type = type;
    e->n_dims = n_dims;
    e->nbytes = (uint64_t)pp_dtype_row_bytes(type, 1);
    for (int i = 0; i < n_dims; i++) {
        e->shape[i] = shape[i];
        e->nbytes *= (uint64_t)shape[i];
    }
    w->data_size += e->nbytes;
    return PP_OK;
}

static void build_header(const struct pp__st_writer *w, struct pp_buf *b)
{
    uint64_t offset = 0;
    pp_buf_puts(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (uint64_t i = 0; i < w->n; i++) {
        const struct pp__st_entry *e = &w->entries[i];
        pp_buf_puts(b, ",");
        pp__synth_json_cstr(b, e->name);
        pp_buf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", pp__st_dtype_name(e->type));
        for (int d = 0; d < e->n_dims; d++)
            pp_buf_printf(b, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        pp_buf_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                        (unsigned long long)(offset + e->nbytes));
        offset += e->nbytes;
    }
    pp_buf_puts(b, "}");
    while (b->len % HEADER_ALIGN && !b->failed)
        pp_buf_puts(b, " ");
}

pp_status pp__st_begin(struct pp__st_writer *w, const char *path)
{
    struct pp_buf header = {0};
    build_header(w, &header);
    if (header.failed) {
        pp_buf_free(&header);
        return pp_error(PP_ERR_NOMEM, "safetensors writer: no memory for the header of %s", path);
    }
    uint64_t len = header.len;
    pp_status st = pp__out_open(&w->out, path);
    if (!st)
        st = pp__out_write(&w->out, &len, 8);
    if (!st)
        st = pp__out_write(&w->out, header.data, header.len);
    pp_buf_free(&header);
    w->cur = w->cur_done = 0;
    return st;
}

pp_status pp__st_write(struct pp__st_writer *w, const void *data, uint64_t n)
{
    if (w->cur >= w->n || n > w->entries[w->cur].nbytes - w->cur_done)
        return pp_error(PP_ERR_INTERNAL,
                        "safetensors writer: %s: more tensor bytes than "
                        "declared",
                        w->out.path);
    pp_status st = pp__out_write(&w->out, data, n);
    if (st)
        return st;
    w->cur_done += n;
    if (w->cur_done == w->entries[w->cur].nbytes) {
        w->cur++;
        w->cur_done = 0;
    }
    return PP_OK;
}

pp_status pp__st_finish(struct pp__st_writer *w)
{
    if (w->cur != w->n)
        return pp_error(PP_ERR_INTERNAL, "safetensors writer: %s: %llu of %llu tensors written",
                        w->out.path, (unsigned long long)w->cur, (unsigned long long)w->n);
    return pp__out_commit(&w->out);
}

void pp__st_free(struct pp__st_writer *w)
{
    if (!w)
        return;
    pp__out_abort(&w->out);
    pp_free(PP_MEM_MISC, w->entries);
    memset(w, 0, sizeof(*w));
}
