/* The stage registry: RegisterStage and Heartbeat, and the liveness check that turns a silent stage
 * into a failed pipeline within stage_timeout_ms. */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/nonce.h"
#include "coordinator/coordinator.h"

struct co_stage *co_stage_find(struct coordinator *co, uint64_t id)
{
    for (int i = 0; i < co->n_stages; i++)
        if (co->stages[i].id == id)
            return &co->stages[i];
    return NULL;
}

static struct co_stage *find_by_address(struct coordinator *co, const char *addr)
{
    for (int i = 0; i < co->n_stages; i++)
        if (strcmp(co->stages[i].address, addr) == 0)
            return &co->stages[i];
    return NULL;
}

/* What a registration says about the stage: its speed, memory and degrees. A stage from before
 * TP reports tp 0 and no per-worker devices: one worker with all the memory. */
static void describe(struct co_stage *s, const Ppserve__V1__RegisterRequest *req)
{
    s->weight_bps = req->weight_bytes_per_second;
    s->memory_bytes = (int64_t)req->memory_bytes;
    s->kv_asked = req->kv_budget_bytes <= (uint64_t)INT64_MAX / 2 ? (int64_t)req->kv_budget_bytes
                                                                   : INT64_MAX / 2;
    s->threads = req->compute_threads;
    s->tp = req->tp > 0 ? (int32_t)req->tp : 1;
    s->ep = req->ep > 0 ? (int32_t)req->ep : 1;
    /* a worker holds what its smallest device holds; CPU shards report the host's memory split
     * among them */
    s->worker_memory = 0;
    for (size_t i = 0; i < req->n_devices; i++) {
        int64_t m = (int64_t)req->devices[i]->memory_bytes;
        if (m > 0 && (s->worker_memory == 0 || m < s->worker_memory))
            s->worker_memory = m;
    }
    if (s->worker_memory == 0 || req->n_devices != (size_t)s->tp)
        s->worker_memory = s->memory_bytes / s->tp;
}

static pp_status on_register(void *ud, const ProtobufCMessage *msg, struct pp_buf *resp)
{
    struct coordinator *co = ud;
    const Ppserve__V1__RegisterRequest *req = (const Ppserve__V1__RegisterRequest *)msg;
    if (req->protocol_version != PPSERVE__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT)
        return pp_error(PP_ERR_PRECONDITION, "protocol version: this coordinator speaks %d, the "
                        "stage %d", PPSERVE__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT,
                        (int)req->protocol_version);
    if (!req->advertised_address || !req->advertised_address[0] ||
        strlen(req->advertised_address) >= sizeof(co->stages[0].address))
        return pp_error(PP_ERR_INVALID_ARG, "advertised_address: expected host:port, got '%s'",
                        req->advertised_address ? req->advertised_address : "");
    Ppserve__V1__RegisterResponse out = PPSERVE__V1__REGISTER_RESPONSE__INIT;
    pp_status st = PP_OK;
    pthread_mutex_lock(&co->mu);
    struct co_stage *s = find_by_address(co, req->advertised_address);
    if (s && co->state != CO_WAITING) {
        /* a stage we assigned came back without its state: the pipeline it was part of is gone;
         * unless the process registering is the one that answered the Assign (a new process on
         * a dead one's address, assigned by setup's retry before it had registered, or one whose
         * id was dropped): it holds its layers */
        int holds = req->instance != 0 && req->instance == s->assigned_instance;
        if ((co->state == CO_SERVING || co->state == CO_STARTING) && !holds)
            co_pipeline_down(co, "stage %s registered again (it restarted and lost its layers)",
                             s->address);
        describe(s, req);
        s->last_seen = pp_clock_mono();
        out.stage_id = s->id;
        co->stages_gen++;
        pthread_cond_broadcast(&co->cond);
    } else if (s || co->state == CO_WAITING) {
        if (!s) {
            if (co->n_stages >= (int)co->cfg.stages) {
                st = pp_error(PP_ERR_EXHAUSTED, "the pipeline already has its %d stages",
                              co->n_stages);
                goto out;
            }
            s = &co->stages[co->n_stages++];
            memset(s, 0, sizeof(*s));
            s->id = ++co->next_stage_id;
            snprintf(s->address, sizeof(s->address), "%s", req->advertised_address);
        }
        describe(s, req);
        s->last_seen = pp_clock_mono();
        s->alive = 1;
        out.stage_id = s->id;
        co->stages_gen++;
        PP_INFO("stage registered id=%llu address=%s threads=%u tp=%d ep=%d weight_gbps=%.2f "
                "worker_memory_mib=%lld kv_mib=%lld (%d of %lld)", (unsigned long long)s->id,
                s->address, s->threads, s->tp, s->ep, s->weight_bps / 1e9,
                (long long)(s->worker_memory >> 20), (long long)(s->kv_asked >> 20),
                co->n_stages, (long long)co->cfg.stages);
        pthread_cond_broadcast(&co->cond);
    } else {
        st = pp_error(PP_ERR_EXHAUSTED, "the pipeline already has its %d stages", co->n_stages);
    }
out:
    pthread_mutex_unlock(&co->mu);
    return st == PP_OK ? pp_rpc_pack(&out.base, resp) : st;
}

static pp_status on_heartbeat(void *ud, const ProtobufCMessage *msg, struct pp_buf *resp)
{
    struct coordinator *co = ud;
    const Ppserve__V1__HeartbeatRequest *req = (const Ppserve__V1__HeartbeatRequest *)msg;
    Ppserve__V1__HeartbeatResponse out = PPSERVE__V1__HEARTBEAT_RESPONSE__INIT;
    pthread_mutex_lock(&co->mu);
    struct co_stage *s = co_stage_find(co, req->stage_id);
    if (!s) {
        out.unknown = 1;
    } else {
        double now = pp_clock_mono();
        s->last_seen = now;
        if (req->stats) {
            const Ppserve__V1__StageStats *in = req->stats;
            Ppserve__V1__StageStats st = PPSERVE__V1__STAGE_STATS__INIT;
            st.busy_seconds = in->busy_seconds;
            st.wall_seconds = in->wall_seconds;
            st.queue_depth = in->queue_depth;
            st.bytes_in = in->bytes_in;
            st.bytes_out = in->bytes_out;
            st.kv_blocks_used = in->kv_blocks_used;
            st.kv_blocks_total = in->kv_blocks_total;
            st.tokens = in->tokens;
            st.bytes_reduced = in->bytes_reduced;
            s->stats = st;
            co_stage_take_experts(s, in);
            struct co_stage_sample smp = {now,         st.busy_seconds, st.wall_seconds,
                                          st.bytes_in, st.bytes_out,    st.tokens,
                                          st.bytes_reduced};
            /* rates cover a window of 2 to 4 seconds: the last heartbeat against an older one */
            if (s->then.at == 0 || now - s->then.at > 4.0)
                s->then = s->now.at != 0 ? s->now : smp;
            s->now = smp;
        }
        if (req->hop_error && req->hop_error[0] && co->state == CO_SERVING)
            co_pipeline_down(co, "stage %s lost its next hop: %s", s->address, req->hop_error);
    }
    pthread_mutex_unlock(&co->mu);
    return pp_rpc_pack(&out.base, resp);
}

/* Checks run every 100-200 ms, and setup's Assign calls reset last_check: a longer gap means this
 * process did not run (stopped, or its host paused it). */
#define CHECK_GAP_S 1.0

void co_check_stages(struct coordinator *co)
{
    double now = pp_clock_mono();
    double limit = (double)co->cfg.stage_timeout_ms / 1000.0;
    double gap = co->last_check > 0 ? now - co->last_check : 0;
    co->last_check = now;
    if (gap > CHECK_GAP_S) {
        /* the stages' heartbeats of that time may still wait in this process's sockets: their
         * silence counts from before the gap, not across it (a stopped coordinator otherwise
         * dropped every stage when it resumed, and failed the running requests) */
        for (int i = 0; i < co->n_stages; i++) {
            struct co_stage *s = &co->stages[i];
            s->last_seen = s->last_seen + gap < now ? s->last_seen + gap : now;
        }
        PP_WARN("stage liveness checked again after %.1f s (this process was stopped): the "
                "stages' silence is counted without the gap", gap);
    }
    for (int i = 0; i < co->n_stages; i++) {
        struct co_stage *s = &co->stages[i];
        if (!s->alive || now - s->last_seen <= limit)
            continue;
        s->alive = 0;
        PP_WARN("stage silent address=%s seconds=%.1f", s->address, now - s->last_seen);
        if (co->state == CO_WAITING) {
            /* not part of a pipeline yet: forget it */
            co_stage_drop(co, i);
            i--;
        } else if (co->state == CO_SERVING || co->state == CO_STARTING) {
            co_pipeline_down(co, "stage %d (%s) is down: no heartbeat for %.1f s", i, s->address,
                             now - s->last_seen);
        }
    }
}

void co_stage_drop(struct coordinator *co, int i)
{
    PP_INFO("stage dropped address=%s", co->stages[i].address);
    co_stage_forget_experts(&co->stages[i]);
    if (co->stages[i].ch && co->n_retired < (int)(sizeof(co->retired) / sizeof(co->retired[0])))
        co->retired[co->n_retired++] = co->stages[i].ch;
    /* keep the pipeline order of the others */
    memmove(&co->stages[i], &co->stages[i + 1],
            (size_t)(co->n_stages - i - 1) * sizeof(co->stages[0]));
    co->n_stages--;
    co->stages_gen++;
}

pp_status co_registry_add(struct coordinator *co)
{
    /* ids start after a random multiple of 2^32 in each coordinator process. Stages keep their id
     * across a coordinator's restart, and heartbeats name the stage by id alone; were ids to start
     * at 1 in every process, a stage's heartbeat could be credited to whichever stage the new
     * coordinator had given its number, so the stage never registered again and the pipeline
     * waited for it for good (and a dead stage looked alive). From a random base, an old id is
     * unknown here (1 chance in 2^32 otherwise), and its stage registers again. */
    co->next_stage_id = (uint64_t)(uint32_t)(pp_nonce64() | 1) << 32;
    pp_status st = pp_rpc_server_add_unary(co->server, "/ppserve.v1.Coordinator/RegisterStage",
                                           &ppserve__v1__register_request__descriptor, on_register,
                                           co);
    if (st == PP_OK)
        st = pp_rpc_server_add_unary(co->server, "/ppserve.v1.Coordinator/Heartbeat",
                                     &ppserve__v1__heartbeat_request__descriptor, on_heartbeat, co);
    return st;
}
