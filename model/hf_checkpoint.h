/* A Hugging Face checkpoint directory: config.json, and model.safetensors or shards listed by
 * model.safetensors.index.json. Shards are mapped only when one of their tensors is asked for, so a
 * stage maps only the files that hold its layers. Needs jansson (PP_HAVE_JANSSON). */
#ifndef PP_HF_CHECKPOINT_H
#define PP_HF_CHECKPOINT_H

#include <stddef.h>

#include "common/status.h"
#include "model/model_config.h"
#include "model/tensor.h"

struct pp_hf_checkpoint;

pp_status pp_hf_open(const char *dir, struct pp_hf_checkpoint **out);
void pp_hf_free(struct pp_hf_checkpoint *h);

/* The hyper-parameters from config.json (validated). */
const struct pp_model_config *pp_hf_config(const struct pp_hf_checkpoint *h);

/* Looks up an HF tensor name, mapping its shard on first use. PP_ERR_NOT_FOUND (no message) when
 * the checkpoint does not list it; other errors carry a message (unreadable shard, bad dtype). */
pp_status pp_hf_tensor(struct pp_hf_checkpoint *h, const char *name, const struct pp_tensor **out);

const char *pp_hf_dir(const struct pp_hf_checkpoint *h);

/* Calls fn for every tensor of every shard (mapping them all), in file order; tensors of a dtype
 * this build cannot read are visited too (with their dtype field unset: PP_DTYPE_COUNT). */
pp_status pp_hf_for_each_tensor(struct pp_hf_checkpoint *h,
                                void (*fn)(void *ud, const char *name, size_t name_len,
                                           const struct pp_tensor *t),
                                void *ud);

#endif
