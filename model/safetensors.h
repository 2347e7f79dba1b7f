/* safetensors reader: one mapped file, its JSON header parsed (jansson) into a tensor directory
 * whose data pointers are checked to lie inside the file. */
#ifndef PP_SAFETENSORS_H
#define PP_SAFETENSORS_H

#include "common/status.h"
#include "model/mapped_file.h"
#include "model/tensor.h"

struct pp_safetensors_entry {
    char *name;
    char dtype_name[16]; /* as written in the header, e.g. "F16" */
    int supported;       /* dtype is F32, F16 or BF16 */
    struct pp_tensor t;
};

struct pp_safetensors {
    struct pp_mapped_file file;
    char *path;
    int64_t n;
    struct pp_safetensors_entry *entries;
};

pp_status pp_safetensors_open(const char *path, struct pp_safetensors **out);
void pp_safetensors_free(struct pp_safetensors *s);

/* The entry for name; NULL when absent. */
const struct pp_safetensors_entry *pp_safetensors_find(const struct pp_safetensors *s,
                                                      const char *name);

#endif
