/* The stage daemon's configuration: one typed table (stage_config.c) read from a libconfig file
 * (deploy/config/stage.cfg documents every key) and overridden by `--key value` flags. */
#ifndef PP_STAGE_CONFIG_H
#define PP_STAGE_CONFIG_H

#include "common/config.h"

struct pp_stage_config {
    char coordinator[PP_CFG_STR_MAX]; /* host:port of the coordinator's control service */
    char listen[PP_CFG_STR_MAX];      /* host:port this stage serves on */
    char advertise[PP_CFG_STR_MAX];   /* host:port others reach it at ("" = listen) */
    char model_root[PP_CFG_STR_MAX];  /* models are loaded only from below this folder */
    int64_t threads;                  /* compute threads, shared among the tp workers; 0: per CPU */
    char devices[PP_CFG_STR_MAX];     /* "auto" | "cpu" | "cuda:N[,N...]" (kernels/devices.h) */
    char cpu_weights[PP_CFG_STR_MAX]; /* "copy" | "map": CPU weights copied or used in place */
    int64_t tp;                       /* tensor-parallel workers; 0 = 1, or ep when ep is set */
    int64_t ep;                       /* expert groups among the workers (MoE); 0 = 1 */
    int64_t kv_mb;                    /* KV cache budget */
    int64_t memory_mb;                /* memory offered to the coordinator; 0: what it may use */
    int64_t max_batch_tokens;         /* rows computed together */
    int64_t queue_depth;              /* microbatches waiting before the stage stops reading */
    int64_t heartbeat_ms;             /* heartbeat period to the coordinator */
    int64_t grace_ms;                 /* drain time on SIGTERM */
    char log_level[PP_CFG_STR_MAX];   /* debug | info | warn | error */
};

extern const struct pp_cfg_key pp_stage_config_keys[];
extern const int pp_stage_config_n_keys;

void pp_stage_config_defaults(struct pp_stage_config *c);
/* Checks what one key alone cannot: a coordinator address is given, log_level is known,
 * model_root is a folder, devices and cpu_weights parse, ep divides tp, a GPU list has one GPU
 * per tp worker. Whether the listed GPUs exist is checked at start-up (pp_devices_resolve). */
pp_status pp_stage_config_check(const struct pp_stage_config *c);

/* The degrees the stage runs with: tp workers (ep alone sets it: pure expert parallelism, as
 * `ppserve run --ep E`; a GPU list alone sets it to one worker per GPU) in ep expert groups (at
 * least 1). Whether the model can be split so is
 * checked per assignment (pp_shard_check). */
void pp_stage_config_degrees(const struct pp_stage_config *c, int32_t *tp, int32_t *ep);

#endif
