/* The coordinator's configuration: one typed table (coordinator_config.c) read from a libconfig
 * file (deploy/config/coordinator.cfg documents every key) and overridden by `--key value` flags.
 */
#ifndef PP_COORDINATOR_CONFIG_H
#define PP_COORDINATOR_CONFIG_H

#include "common/config.h"

struct pp_coordinator_config {
    char listen[PP_CFG_STR_MAX];  /* host:port for the client API and the stages' control calls */
    char advertise[PP_CFG_STR_MAX]; /* where the last stage delivers results ("" = as registered) */
    char model[PP_CFG_STR_MAX];   /* model name, relative to every stage's model_root */
    char model_root[PP_CFG_STR_MAX]; /* the coordinator's own copy: tokenizer, shapes, identity */
    int64_t stages;               /* stages per pipeline */
    struct pp_cfg_ints layers;    /* layers per stage; empty = planned from measured cost */
    int64_t max_batch_tokens;     /* token budget of one microbatch */
    int64_t microbatches;         /* microbatches in flight (0 = stages + 1) */
    int64_t queue_max;            /* requests waiting for admission before RESOURCE_EXHAUSTED */
    int64_t default_max_tokens;   /* when a request asks for 0 */
    int64_t request_timeout_ms;   /* longest a request may run */
    int64_t stage_timeout_ms;     /* a stage silent this long is declared dead */
    int64_t failover_wait_ms;     /* accepted requests wait this long for a failed pipeline to
                                   * form again, then fail (0: at once) */
    int64_t grace_ms;             /* drain time on SIGTERM */
    char log_level[PP_CFG_STR_MAX];
};

extern const struct pp_cfg_key pp_coordinator_config_keys[];
extern const int pp_coordinator_config_n_keys;

void pp_coordinator_config_defaults(struct pp_coordinator_config *c);
/* Checks what one key alone cannot: a model is named, layers has one entry per stage, the model
 * name stays inside a model root (no absolute path, no ".."), log_level is known. */
pp_status pp_coordinator_config_check(const struct pp_coordinator_config *c);

#endif
