/* GGUF v2/v3 reader: parses the header, metadata and tensor directory of a mapped file, checking
 * every length and offset against the file size. Tensor data is used in place. */
#ifndef PP_GGUF_H
#define PP_GGUF_H

#include <stdint.h>

#include "common/status.h"
#include "model/mapped_file.h"
#include "model/tensor.h"

enum pp_gguf_type {
    PP_GGUF_U8 = 0, PP_GGUF_I8, PP_GGUF_U16, PP_GGUF_I16, PP_GGUF_U32, PP_GGUF_I32, PP_GGUF_F32,
    PP_GGUF_BOOL, PP_GGUF_STRING, PP_GGUF_ARRAY, PP_GGUF_U64, PP_GGUF_I64, PP_GGUF_F64,
    PP_GGUF_TYPE_COUNT
};

/* A string inside the map: not NUL-terminated. */
struct pp_gguf_str {
    const char *ptr;
    uint64_t len;
};

struct pp_gguf_kv {
    struct pp_gguf_str key;
    enum pp_gguf_type type;
    const uint8_t *value;       /* the value's bytes (for arrays: the first element) */
    enum pp_gguf_type arr_type; /* arrays only */
    uint64_t arr_count;         /* arrays only */
};

struct pp_gguf_tensor_info {
    struct pp_gguf_str name;
    struct pp_tensor t;
};

struct pp_gguf {
    struct pp_mapped_file file;
    uint32_t version;
    int64_t n_kv;
    struct pp_gguf_kv *kv;
    int64_t n_tensors;
    struct pp_gguf_tensor_info *tensors;
    uint64_t alignment;
    const char *path; /* owned copy */
};

/* Opens and validates path. *out is freed with pp_gguf_free. */
pp_status pp_gguf_open(const char *path, struct pp_gguf **out);
void pp_gguf_free(struct pp_gguf *g);

/* Metadata lookup; NULL when absent. */
const struct pp_gguf_kv *pp_gguf_find(const struct pp_gguf *g, const char *key);
/* Typed getters: PP_ERR_NOT_FOUND when absent (no message), PP_ERR_FORMAT with a message when the
 * value has an incompatible type. Integer getters accept any integer type that fits. */
pp_status pp_gguf_get_i64(const struct pp_gguf *g, const char *key, int64_t *out);
pp_status pp_gguf_get_f32(const struct pp_gguf *g, const char *key, float *out);
pp_status pp_gguf_get_bool(const struct pp_gguf *g, const char *key, int *out);
pp_status pp_gguf_get_str(const struct pp_gguf *g, const char *key, struct pp_gguf_str *out);
/* Fills out[arr_count] with the strings of a string array (bounds were validated at open). */
void pp_gguf_arr_strings(const struct pp_gguf_kv *kv, struct pp_gguf_str *out);

/* Tensor lookup by name; NULL when absent. */
const struct pp_tensor *pp_gguf_tensor(const struct pp_gguf *g, const char *name);

#endif
