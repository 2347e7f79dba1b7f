/* Forming a pipeline: wait for the stages, plan the partition from what they measured (or take the
 * configured `layers`), assign the ranges from the last stage to the first (so that every stage's
 * next hop is ready for its handshake), and open the hop to stage 0. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/rpc/hop.h"
#include "coordinator/coordinator.h"
#include "coordinator/planner.h"
#include "model/kv_cache.h"

#define ASSIGN_TIMEOUT_MS 120000

static void on_first_hop_ack(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    (void)st;
    struct coordinator *co = ud;
    ProtobufCMessage *m;
    if (pp_rpc_unpack(&ppserve__v1__hop_ack__descriptor, data, len, &m) != PP_OK) {
        PP_WARN("stage 0 sent a malformed ack: %s", pp_error_detail());
        return;
    }
    const Ppserve__V1__HopAck *ack = (const Ppserve__V1__HopAck *)m;
    if (ack->code != 0)
        PP_DEBUG("stage 0 failed microbatch=%llu code=%s: %s",
                 (unsigned long long)ack->microbatch_id, pp_rpc_code_name((int)ack->code),
                 ack->message);
    (void)co;
    protobuf_c_message_free_unpacked(m, NULL);
}

static void on_first_hop_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    struct coordinator *co = ud;
    pthread_mutex_lock(&co->mu);
    if (co->first_hop == st && (co->state == CO_SERVING || co->state == CO_STARTING))
        co_pipeline_down(co, "the hop to stage 0 (%s) ended: %s", co->stages[0].address,
                         status == PP_OK ? "closed" : pp_error_detail());
    pthread_mutex_unlock(&co->mu);
}

static const struct pp_rpc_stream_cbs first_hop_cbs = {
    .on_message = on_first_hop_ack,
    .on_end = on_first_hop_end,
};

/* The setup failed in a way that retrying cannot mend (mu held): the pipeline is down with the
 * reason, and Status says so until a stage changes. */
static void block(struct coordinator *co)
{
    co->state = CO_DOWN;
    co->blocked = 1;
    snprintf(co->last_failure, sizeof(co->last_failure), "%s", pp_error_detail());
    snprintf(co->state_reason, sizeof(co->state_reason), "%s (the coordinator tries again when a "
             "stage registers or leaves, and every %d s)", pp_error_detail(), CO_BLOCKED_RETRY_S);
}

/* Sleeps on co->cond for at most 200 ms (a registration or heartbeat wakes it), then checks the
 * stages' liveness; mu held. */
static void wait_tick(struct coordinator *co)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&co->cond, &co->mu, &ts);
    co_check_stages(co);
    co_check_deadlines(co); /* requests waiting for a new pipeline have their limits too */
}

/* Sets the not-serving reason (mu held): what the coordinator does now, and, after a failure,
 * why the last pipeline is gone (down_cause), so that Status never loses the cause while it
 * re-forms, and why the last attempt to form one failed, where that differs. */
static void set_reason(struct coordinator *co, const char *doing)
{
    int n = snprintf(co->state_reason, sizeof(co->state_reason), "%s", doing);
    if (co->down_cause[0] && n < (int)sizeof(co->state_reason))
        n += snprintf(co->state_reason + n, sizeof(co->state_reason) - (size_t)n,
                      "; the last pipeline ended: %s", co->down_cause);
    if (co->last_failure[0] && strcmp(co->last_failure, co->down_cause) != 0 &&
        n < (int)sizeof(co->state_reason))
        snprintf(co->state_reason + n, sizeof(co->state_reason) - (size_t)n,
                 "; the last attempt failed: %s", co->last_failure);
}

/* Waits until cfg.stages stages are alive (mu held). */
static pp_status wait_for_stages(struct coordinator *co)
{
    while (!*co->interrupted && co->n_stages < (int)co->cfg.stages) {
        wait_tick(co);
        char doing[64];
        snprintf(doing, sizeof(doing), "waiting for stages: %d of %lld", co->n_stages,
                 (long long)co->cfg.stages);
        set_reason(co, doing);
    }
    return *co->interrupted ? pp_error(PP_ERR_CANCELLED, "stopping") : PP_OK;
}

/* Each stage's KV budget once its layers are planned: what its workers' memory leaves beside
 * their weights and the process's reserve, up to what the stage asked for (its kv_mb). A stage
 * that did not say (kv_asked 0), or whose memory is unknown, keeps its own choice. */
static void kv_budgets(struct coordinator *co, const struct pp_plan_model *pm,
                       const int32_t *counts)
{
    struct pp_plan_model weights = *pm;
    weights.kv_layer_bytes = 0;
    for (int i = 0; i < co->n_stages; i++) {
        struct co_stage *s = &co->stages[i];
        s->kv_budget = 0;
        if (s->kv_asked <= 0 || s->worker_memory <= 0)
            continue;
        int64_t used = pp_plan_worker_bytes(&weights, i, co->n_stages, s->tp, counts[i]);
        int64_t left = (s->worker_memory - used) * s->tp;
        s->kv_budget = left < s->kv_asked ? left : s->kv_asked;
        if (s->kv_budget < s->kv_asked)
            PP_WARN("stage %d (%s): KV budget %.1f MiB of the %.1f MiB it asked for (kv_mb): "
                    "each of its %d workers has %.1f MiB, of which %d layers' weights and the "
                    "process's reserve take %.1f MiB",
                    i, s->address, (double)s->kv_budget / (1 << 20),
                    (double)s->kv_asked / (1 << 20), s->tp, (double)s->worker_memory / (1 << 20),
                    counts[i], (double)used / (1 << 20));
    }
}

static pp_status plan(struct coordinator *co, int32_t *counts)
{
    int n = co->n_stages;
    /* a stage keeps room for at least one sequence of PP_PLAN_KV_FLOOR_POSITIONS positions */
    int32_t floor = co->mcfg.max_context < PP_PLAN_KV_FLOOR_POSITIONS
                        ? co->mcfg.max_context
                        : PP_PLAN_KV_FLOOR_POSITIONS;
    struct pp_plan_model pm = {
        .n_layers = co->mcfg.n_layers,
        .layer_bytes = co->layer_bytes,
        .kv_layer_bytes =
            pp_kv_block_bytes(1, co->mcfg.n_kv_heads * co->mcfg.head_dim, 1) * floor,
        .first_bytes = co->first_bytes,
        .last_bytes = co->last_bytes,
        .last_extra_layers = co->layer_bytes > 0 ? (double)co->last_bytes / co->layer_bytes : 0,
        .n_kv_heads = co->mcfg.n_kv_heads,
        .worker_reserve_bytes = (int64_t)PP_MEMORY_HEADROOM,
    };
    struct pp_plan_stage ps[CO_MAX_STAGES];
    for (int i = 0; i < n; i++) {
        const struct co_stage *s = &co->stages[i];
        /* the probe ran the stage's tp workers together: its rate is the stage's, TP included */
        ps[i].seconds_per_layer = s->weight_bps > 0 ? (double)co->layer_bytes / s->weight_bps : 1.0;
        ps[i].memory_bytes = s->worker_memory > 0 ? s->worker_memory : INT64_MAX / 4;
        ps[i].tp = s->tp;
    }
    pp_status st;
    if (co->cfg.layers.n > 0) {
        for (int i = 0; i < n; i++)
            counts[i] = (int32_t)co->cfg.layers.v[i];
        st = pp_plan_check(&pm, ps, n, counts);
    } else {
        st = pp_plan_partition(&pm, ps, n, counts);
    }
    if (st == PP_OK)
        kv_budgets(co, &pm, counts);
    return st;
}

/* A stage answered, and retrying the same assignment would get the same answer: its
 * configuration, its copy of the model or its memory has to change first. */
static int refused(pp_status st)
{
    return st == PP_ERR_INVALID_ARG || st == PP_ERR_PRECONDITION || st == PP_ERR_NOT_FOUND ||
           st == PP_ERR_EXHAUSTED || st == PP_ERR_FORMAT || st == PP_ERR_UNSUPPORTED ||
           st == PP_ERR_OUT_OF_RANGE;
}

/* One Assign call (mu NOT held). */
static pp_status assign_one(struct coordinator *co, struct co_stage *s, int index, int n,
                            const char *next_hop)
{
    Ppserve__V1__Assignment a = PPSERVE__V1__ASSIGNMENT__INIT;
    a.stage_id = s->id;
    a.index = (uint32_t)index;
    a.n_stages = (uint32_t)n;
    a.model = co->cfg.model;
    a.model_id = co->model_id;
    a.first_layer = s->first;
    a.last_layer = s->last;
    a.next_hop = (char *)next_hop;
    a.coordinator = (char *)co->cfg.advertise;
    a.max_batch_tokens = (uint32_t)co->cfg.max_batch_tokens;
    a.kv_budget_bytes = (uint64_t)s->kv_budget;
    ProtobufCMessage *resp;
    pp_status st = pp_rpc_call(s->ch, "/ppserve.v1.Stage/Assign", &a.base,
                               &ppserve__v1__assign_response__descriptor, ASSIGN_TIMEOUT_MS, &resp,
                               NULL);
    if (st != PP_OK) {
        /* the stage's own words, without the method name the call put first */
        const char *d = pp_error_detail(), *method = "/ppserve.v1.Stage/Assign: ";
        if (strncmp(d, method, strlen(method)) == 0)
            d += strlen(method);
        return pp_error(st, "stage %d (%s, tp %d) %s layers [%d, %d): %s", index, s->address,
                        s->tp, refused(st) ? "refused" : "could not take", s->first, s->last, d);
    }
    const Ppserve__V1__AssignResponse *r = (const Ppserve__V1__AssignResponse *)resp;
    s->kv_blocks = r->kv_blocks;
    s->kv_block_tokens = r->kv_block_tokens;
    s->max_seqs = r->max_seqs;
    s->max_context = r->max_context;
    s->assigned_instance = r->instance;
    PP_INFO("stage assigned index=%d address=%s layers=[%d,%d) kv_blocks=%u kv_budget_mib=%.1f "
            "weights_mib=%.1f", index, s->address, s->first, s->last, r->kv_blocks,
            (double)s->kv_budget / (1 << 20), (double)r->weight_bytes / (1 << 20));
    protobuf_c_message_free_unpacked(resp, NULL);
    return PP_OK;
}

static pp_status open_first_hop(struct coordinator *co)
{
    struct pp_rpc_stream *st;
    pp_status s = pp_rpc_stream_open(co->stages[0].ch, "/ppserve.v1.Stage/Forward", 0,
                                     &first_hop_cbs, co, &st);
    if (s != PP_OK)
        return s;
    struct pp_buf hs = {0};
    s = pp_hop_handshake_pack(PPSERVE__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT,
                              co->model_id, 0, &hs);
    if (s == PP_OK)
        s = pp_rpc_stream_send(st, hs.data, hs.len);
    pp_buf_free(&hs);
    if (s != PP_OK) {
        pp_rpc_stream_cancel(st);
        pp_rpc_stream_release(st);
        return s;
    }
    pthread_mutex_lock(&co->mu);
    co->first_hop = st;
    pthread_mutex_unlock(&co->mu);
    return PP_OK;
}

pp_status co_setup_pipeline(struct coordinator *co)
{
    pthread_mutex_lock(&co->mu);
    co->state = CO_WAITING;
    pp_status st = wait_for_stages(co);
    if (st != PP_OK) {
        pthread_mutex_unlock(&co->mu);
        return st;
    }
    co->state = CO_STARTING;
    co->blocked = 0;
    set_reason(co, "assigning layers");
    int n = co->n_stages;
    int32_t counts[CO_MAX_STAGES];
    st = plan(co, counts);
    if (st != PP_OK) {
        st = pp_error(st, "no partition: %s", pp_error_detail());
        block(co);
        pthread_mutex_unlock(&co->mu);
        return st;
    }
    int32_t layer = 0;
    char ranges[512] = "";
    for (int i = 0; i < n; i++) {
        struct co_stage *s = &co->stages[i];
        s->first = layer;
        s->last = layer + counts[i];
        layer = s->last;
        size_t used = strlen(ranges);
        snprintf(ranges + used, sizeof(ranges) - used, "%s[%d,%d)", i ? " " : "", s->first,
                 s->last);
    }
    PP_INFO("partition stages=%d layers=%s (%s)", n, ranges,
            co->cfg.layers.n > 0 ? "configured" : "planned from measured speed");
    pthread_mutex_unlock(&co->mu);

    /* the stages' addresses and the order are fixed now (only this thread changes the list
     * outside CO_WAITING) */
    for (int i = 0; i < n && st == PP_OK; i++)
        if (!co->stages[i].ch)
            st = pp_rpc_channel_new(co->stages[i].address, &co->stages[i].ch);
    for (int i = n - 1; i >= 0 && st == PP_OK; i--)
        st = assign_one(co, &co->stages[i], i, n, i + 1 < n ? co->stages[i + 1].address : "");
    if (st == PP_OK)
        st = open_first_hop(co);

    pthread_mutex_lock(&co->mu);
    /* the Assign calls took this thread's time, not the process's: heartbeats went on arriving,
     * so the next liveness check has no gap to leave out (co_check_stages) */
    co->last_check = 0;
    if (st == PP_OK && co->state == CO_STARTING) {
        co->kv_blocks_cap = INT32_MAX;
        co->max_seqs = INT32_MAX;
        co->max_context = co->mcfg.max_context;
        co->kv_block_tokens = (int32_t)co->stages[0].kv_block_tokens;
        for (int i = 0; i < n; i++) {
            const struct co_stage *s = &co->stages[i];
            if ((int32_t)s->kv_blocks < co->kv_blocks_cap)
                co->kv_blocks_cap = (int32_t)s->kv_blocks;
            if ((int32_t)s->max_seqs < co->max_seqs)
                co->max_seqs = (int32_t)s->max_seqs;
            if (s->max_context > 0 && s->max_context < co->max_context)
                co->max_context = s->max_context;
            if ((int32_t)s->kv_block_tokens != co->kv_block_tokens) {
                st = pp_error(PP_ERR_INTERNAL, "stages disagree on the KV block size: %u vs %d",
                              s->kv_block_tokens, co->kv_block_tokens);
            }
        }
        co->kv_blocks_reserved = 0;
        co->pipeline_gen++;
        /* default P + 1: with only P, a stage waits whenever the next one is slower on one
         * microbatch; fewer than P leaves stages idle (allowed, to measure exactly that) */
        co->max_in_flight = co->cfg.microbatches > 0 ? (int)co->cfg.microbatches : n + 1;
    } else if (st == PP_OK) {
        st = pp_error(PP_ERR_UNAVAILABLE, "%s", co->state_reason);
    }
    if (st == PP_OK) {
        co->state = CO_SERVING;
        co->hold_until = 0; /* the requests that waited are admitted first (co_schedule) */
        co->last_failure[0] = '\0';
        co->down_cause[0] = '\0';
        snprintf(co->state_reason, sizeof(co->state_reason), "serving");
        co->rate_t0 = pp_clock_mono();
        co->rate_tokens0 = co->tokens_generated;
        pp_rpc_health_set(co->health, "", PP_HEALTH_SERVING);
        pp_rpc_health_set(co->health, "ppserve.v1.Ppserve", PP_HEALTH_SERVING);
        PP_INFO("pipeline serving stages=%d layers=%s kv_blocks=%d max_seqs=%d context=%d "
                "microbatches=%d", n, ranges, co->kv_blocks_cap, co->max_seqs, co->max_context,
                co->max_in_flight);
        co_schedule(co);
    } else if (co->state == CO_STARTING && refused(st)) {
        block(co);
    } else if (co->state == CO_STARTING) {
        co->state = CO_DOWN;
        snprintf(co->state_reason, sizeof(co->state_reason), "%s", pp_error_detail());
        snprintf(co->last_failure, sizeof(co->last_failure), "%s", pp_error_detail());
    }
    pthread_mutex_unlock(&co->mu);
    return st;
}

void co_setup_wait_change(struct coordinator *co, double timeout_s)
{
    pthread_mutex_lock(&co->mu);
    uint64_t gen = co->stages_gen;
    double deadline = pp_clock_mono() + timeout_s;
    int silent = 0;
    while (!*co->interrupted && co->stages_gen == gen && !silent && pp_clock_mono() < deadline) {
        wait_tick(co);
        for (int i = 0; i < co->n_stages; i++)
            silent |= !co->stages[i].alive;
    }
    pthread_mutex_unlock(&co->mu);
}
