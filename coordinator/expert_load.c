/* The MoE expert load the stages report in their heartbeats, kept per stage for Status: a copy of
 * the heartbeat's ExpertLoad entries (checked for size, since they come from the network) with
 * the max/mean ratios of experts and workers filled in. */
#include "common/buf.h"
#include "common/log.h"
#include "coordinator/coordinator.h"

#define MAX_LAYERS 4096
#define MAX_EXPERTS 4096
#define MAX_WORKERS 64

void co_stage_forget_experts(struct co_stage *s)
{
    if (s->experts)
        ppserve__v1__stage_stats__free_unpacked(s->experts, NULL);
    s->experts = NULL;
}

static double max_over_mean(const uint64_t *v, size_t n)
{
    uint64_t max = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += (double)v[i];
        max = v[i] > max ? v[i] : max;
    }
    return sum > 0 ? (double)max * (double)n / sum : 0.0;
}

void co_stage_take_experts(struct co_stage *s, const Ppserve__V1__StageStats *in)
{
    co_stage_forget_experts(s);
    if (in->n_expert_load == 0)
        return;
    if (in->n_expert_load > MAX_LAYERS) {
        PP_WARN("stage %s: heartbeat with %zu expert-load layers (at most %d): ignored",
                s->address, in->n_expert_load, MAX_LAYERS);
        return;
    }
    for (size_t i = 0; i < in->n_expert_load; i++) {
        const Ppserve__V1__ExpertLoad *l = in->expert_load[i];
        if (l->n_tokens_per_expert > MAX_EXPERTS || l->n_tokens_per_worker > MAX_WORKERS) {
            PP_WARN("stage %s: expert load of layer %d has %zu experts and %zu workers (at most "
                    "%d and %d): ignored", s->address, l->layer, l->n_tokens_per_expert,
                    l->n_tokens_per_worker, MAX_EXPERTS, MAX_WORKERS);
            return;
        }
    }
    /* a deep copy through the wire format: only the expert load, owned by protobuf-c */
    Ppserve__V1__StageStats only = PPSERVE__V1__STAGE_STATS__INIT;
    only.n_expert_load = in->n_expert_load;
    only.expert_load = in->expert_load;
    struct pp_buf b = {0};
    if (pp_rpc_pack(&only.base, &b) != PP_OK) {
        pp_buf_free(&b);
        return;
    }
    s->experts = ppserve__v1__stage_stats__unpack(NULL, b.len, (const uint8_t *)b.data);
    pp_buf_free(&b);
    for (size_t i = 0; s->experts && i < s->experts->n_expert_load; i++) {
        Ppserve__V1__ExpertLoad *l = s->experts->expert_load[i];
        l->max_over_mean_expert = max_over_mean(l->tokens_per_expert, l->n_tokens_per_expert);
        l->max_over_mean_worker = max_over_mean(l->tokens_per_worker, l->n_tokens_per_worker);
    }
}
