/* A small GGUF v3 writer: metadata and tensor infos are collected in memory, then the header goes
 * out and the tensors' bytes are streamed in the order they were declared, each padded to the
 * alignment (32). Little-endian hosts only, as the format is. */
#include <string.h>

#include "common/alloc.h"
#include "model/synth-impl.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" */
#define GGUF_VERSION 3u

void pp__gguf_init(struct pp__gguf_writer *w)
{
    memset(w, 0, sizeof(*w));
}

uint32_t pp__gguf_ggml_type(enum pp_dtype t)
{
    switch (t) {
    case PP_DTYPE_F16:
        return 1;
    case PP_DTYPE_Q8_0:
        return 8;
    case PP_DTYPE_BF16:
        return 30;
    default:
        return 0;
    }
}

static void put_u32(struct pp_buf *b, uint32_t v)
{
    pp_buf_put(b, &v, 4);
}

static void put_u64(struct pp_buf *b, uint64_t v)
{
    pp_buf_put(b, &v, 8);
}

static void put_str(struct pp_buf *b, const char *s)
{
    uint64_t n = strlen(s);
    put_u64(b, n);
    pp_buf_put(b, s, (size_t)n);
}

static void put_key(struct pp__gguf_writer *w, const char *key, uint32_t type)
{
    put_str(&w->kv, key);
    put_u32(&w->kv, type);
    w->n_kv++;
}

void pp__gguf_add_u32(struct pp__gguf_writer *w, const char *key, uint32_t v)
{
    put_key(w, key, PP__GGUF_U32);
    put_u32(&w->kv, v);
}

void pp__gguf_add_i32(struct pp__gguf_writer *w, const char *key, int32_t v)
{
    put_key(w, key, PP__GGUF_I32);
    pp_buf_put(&w->kv, &v, 4);
}

void pp__gguf_add_u64(struct pp__gguf_writer *w, const char *key, uint64_t v)
{
    put_key(w, key, PP__GGUF_U64);
    put_u64(&w->kv, v);
}

void pp__gguf_add_f32(struct pp__gguf_writer *w, const char *key, float v)
{
    put_key(w, key, PP__GGUF_F32);
    pp_buf_put(&w->kv, &v, 4);
}

void pp__gguf_add_bool(struct pp__gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    put_key(w, key, PP__GGUF_BOOL);
    pp_buf_put(&w->kv, &b, 1);
}

void pp__gguf_add_str(struct pp__gguf_writer *w, const char *key, const char *v)
{
    put_key(w, key, PP__GGUF_STRING);
    put_str(&w->kv, v);
}

static void put_array_head(struct pp__gguf_writer *w, const char *key, uint32_t elem, uint64_t n)
{
    put_key(w, key, PP__GGUF_ARRAY);
    put_u32(&w->kv, elem);
    put_u64(&w->kv, n);
}

void pp__gguf_add_str_array(struct pp__gguf_writer *w, const char *key, const char *const *v,
                            uint64_t n)
{
    put_array_head(w, key, PP__GGUF_STRING, n);
    for (uint64_t i = 0; i < n; i++)
        put_str(&w->kv, v[i]);
}

void pp__gguf_add_f32_array(struct pp__gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    put_array_head(w, key, PP__GGUF_F32, n);
    pp_buf_put(&w->kv, v, (size_t)n * 4);
}

void pp__gguf_add_i32_array(struct pp__gguf_writer *w, const char *key, const int32_t *v,
                            uint64_t n)
{
    put_array_head(w, key, PP__GGUF_I32, n);
    pp_buf_put(&w->kv, v, (size_t)n * 4);
}

static uint64_t align_up(uint64_t x)
{
    return (x + PP__GGUF_ALIGN - 1) / PP__GGUF_ALIGN * PP__GGUF_ALIGN;
}

pp_status pp__gguf_add_tensor(struct pp__gguf_writer *w, const char *name, int n_dims,
                              const int64_t *shape, enum pp_dtype type)
{
    if (n_dims < 1 || n_dims > 4 || shape[n_dims - 1] <= 0)
        return pp_error(PP_ERR_INTERNAL, "gguf writer: tensor %s: bad shape", name);
    int64_t row_bytes = pp_dtype_row_bytes(type, shape[n_dims - 1]);
    if (row_bytes < 0)
        return pp_error(PP_ERR_INVALID_ARG,
                        "gguf writer: tensor %s: rows of %lld elements "
                        "cannot be stored as %s",
                        name, (long long)shape[n_dims - 1], pp_dtype_name(type));
    uint64_t nbytes = (uint64_t)row_bytes;
    for (int i = 0; i < n_dims - 1; i++)
        nbytes *= (uint64_t)shape[i];
    if (w->n_tensors == w->cap) {
        uint64_t cap = w->cap ? 2 * w->cap : 64;
        struct pp__gguf_tensor_info *t = pp_alloc(PP_MEM_MISC, (size_t)cap * sizeof(*t));
        if (!t)
            return pp_error(PP_ERR_NOMEM, "gguf writer: no memory for tensor infos");
        if (w->n_tensors)
            memcpy(t, w->tensors, (size_t)w->n_tensors * sizeof(*t));
        pp_free(PP_MEM_MISC, w->tensors);
        w->tensors = t;
        w->cap = cap;
    }
    struct pp__gguf_tensor_info *t = &w->tensors[w->n_tensors++];
    t->nbytes = nbytes;
    t->offset = w->data_size;
    w->data_size = align_up(w->data_size + nbytes);

    put_str(&w->infos, name);
    put_u32(&w->infos, (uint32_t)n_dims);
    for (int i = n_dims - 1; i >= 0; i--) /* GGUF lists the fastest-varying axis first */
        put_u64(&w->infos, (uint64_t)shape[i]);
    put_u32(&w->infos, pp__gguf_ggml_type(type));
    put_u64(&w->infos, t->offset);
    return PP_OK;
}

pp_status pp__gguf_begin(struct pp__gguf_writer *w, const char *path)
{
    if (w->kv.failed || w->infos.failed)
        return pp_error(PP_ERR_NOMEM, "gguf writer: no memory for the header of %s", path);
    struct pp_buf head = {0};
    put_u32(&head, GGUF_MAGIC);
    put_u32(&head, GGUF_VERSION);
    put_u64(&head, w->n_tensors);
    put_u64(&head, w->n_kv);
    if (head.failed)
        return pp_error(PP_ERR_NOMEM, "gguf writer: no memory for the header of %s", path);
    pp_status st = pp__out_open(&w->out, path);
    if (!st)
        st = pp__out_write(&w->out, head.data, head.len);
    pp_buf_free(&head);
    if (!st)
        st = pp__out_write(&w->out, w->kv.data, w->kv.len);
    if (!st)
        st = pp__out_write(&w->out, w->infos.data, w->infos.len);
    if (!st)
        st = pp__out_pad(&w->out, PP__GGUF_ALIGN, 0);
    w->data_start = w->out.pos;
    w->cur = w->cur_done = 0;
    return st;
}

pp_status pp__gguf_write(struct pp__gguf_writer *w, const void *data, uint64_t n)
{
    if (w->cur >= w->n_tensors || n > w->tensors[w->cur].nbytes - w->cur_done)
        return pp_error(PP_ERR_INTERNAL, "gguf writer: %s: more tensor bytes than declared",
                        w->out.path);
    pp_status st = pp__out_write(&w->out, data, n);
    if (st)
        return st;
    w->cur_done += n;
    if (w->cur_done == w->tensors[w->cur].nbytes) {
        w->cur++;
        w->cur_done = 0;
        return pp__out_pad(&w->out, PP__GGUF_ALIGN, 0);
    }
    return PP_OK;
}

pp_status pp__gguf_finish(struct pp__gguf_writer *w)
{
    if (w->cur != w->n_tensors || w->out.pos != w->data_start + w->data_size)
        return pp_error(PP_ERR_INTERNAL, "gguf writer: %s: %llu of %llu tensors written",
                        w->out.path, (unsigned long long)w->cur, (unsigned long long)w->n_tensors);
    return pp__out_commit(&w->out);
}

void pp__gguf_free(struct pp__gguf_writer *w)
{
    if (!w)
        return;
    pp__out_abort(&w->out);
    pp_buf_free(&w->kv);
    pp_buf_free(&w->infos);
    pp_free(PP_MEM_MISC, w->tensors);
    memset(w, 0, sizeof(*w));
}
