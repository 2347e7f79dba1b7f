/* Internal to model/: one opened model file (GGUF) or checkpoint directory (HF) behind a common
 * lookup. Tensors are named by their GGUF names; the HF side translates. */
#ifndef PP_SOURCE_H
#define PP_SOURCE_H

#include <limits.h>
#include <stddef.h>

#include "common/status.h"
#include "model/model_config.h"
#include "model/tensor.h"

struct pp_gguf;
struct pp_hf_checkpoint;

struct pp_source {
    enum pp_model_format format;
    struct pp_gguf *gguf;         /* GGUF only */
    struct pp_hf_checkpoint *hf;  /* HF only */
    struct pp_model_config cfg;
    const float *rope_divisors;   /* GGUF rope_freqs.weight [head_dim/2] (f32), or NULL */
    char path[PATH_MAX];
};

/* A directory opens as an HF checkpoint, a file as GGUF. */
pp_status pp__source_open(const char *path, struct pp_source **out);
void pp__source_free(struct pp_source *s);

/* Looks up a tensor by GGUF name. PP_ERR_NOT_FOUND (without a message) when the model lacks it.
 * HF MoE experts answer to the names of split GGUF files, blk.N.ffn_{gate,up,down}.E.weight. */
pp_status pp__source_tensor(struct pp_source *s, const char *gguf_name,
                            const struct pp_tensor **out);

/* Calls fn for every tensor of the model (every shard of an HF checkpoint is mapped). */
typedef void (*pp__tensor_visit_fn)(void *ud, const char *name, size_t name_len,
                                    const struct pp_tensor *t);
pp_status pp__source_for_each_tensor(struct pp_source *s, pp__tensor_visit_fn fn, void *ud);

/* Reads the hyper-parameters of a GGUF file (model/gguf_config.c). */
pp_status pp__gguf_read_config(const struct pp_gguf *g, const char *path,
                               struct pp_model_config *c);

#endif
