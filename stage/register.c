/* The control thread: registers the stage with the coordinator (retrying every 500 ms until it
 * answers), then sends a heartbeat with the stage's counters every heartbeat_ms. A coordinator that
 * answers a heartbeat with `unknown` has restarted: the stage registers again. Failures are logged
 * (the first, then every 10th) and never fatal. Every call has a deadline, so stopping the thread
 * takes at most one deadline. Once the stage leaves (SIGTERM), a registered stage's heartbeats give
 * way to Leave calls (leave.c), and the thread never registers again. */
#include <stdio.h>
#include <string.h>

#include "common/limits.h"
#include "common/log.h"
#include "stage/stage.h"

#define REGISTER_RETRY_MS 500
#define REGISTER_DEADLINE_MS 2000
#define HEARTBEAT_DEADLINE_MS 1000
#define HEARTBEAT_WARN_AFTER 3 /* consecutive failures before a warning */

static const char *const REGISTER_METHOD = "/ppserve.v1.Coordinator/RegisterStage";
static const char *const HEARTBEAT_METHOD = "/ppserve.v1.Coordinator/Heartbeat";

int pp_stage_ctl_sleep(struct pp_stage *s, int64_t ms, int wake_on_leave)
{
    double deadline = pp_clock_mono() + (double)ms / 1000.0;
    pthread_mutex_lock(&s->ctl_mu);
    while (!s->ctl_stop && !(wake_on_leave && atomic_load(&s->leaving)) &&
           pp_stage_cond_wait_until(&s->ctl_cv, &s->ctl_mu, deadline))
        ;
    int go_on = !s->ctl_stop && !(wake_on_leave && atomic_load(&s->leaving));
    pthread_mutex_unlock(&s->ctl_mu);
    return go_on;
}

/* Sleeps ms unless the thread is told to stop or leave; returns 0 once it must. */
static int ctl_sleep(struct pp_stage *s, int64_t ms)
{
    return pp_stage_ctl_sleep(s, ms, 1);
}

static int ctl_stopped(struct pp_stage *s)
{
    pthread_mutex_lock(&s->ctl_mu);
    int stop = s->ctl_stop;
    pthread_mutex_unlock(&s->ctl_mu);
    return stop;
}

/* A fresh channel after a failure: gRPC would otherwise back off reconnecting for up to two
 * minutes, long after the coordinator is back. */
static pp_status reconnect(struct pp_stage *s, struct pp_rpc_channel **ch)
{
    pp_rpc_channel_free(*ch);
    *ch = NULL;
    return pp_rpc_channel_new(s->cfg.coordinator, ch);
}

static pp_status register_once(struct pp_stage *s, struct pp_rpc_channel *ch)
{
    /* the memory this process may use (a cgroup limit, a pod's, below the host's RAM), or less:
     * memory_mb (resolve_limits in stage/main.c) */
    uint64_t mem = s->memory.usable;
    /* one device per worker: a GPU's own memory, or the CPU shards' even share of the host's */
    Ppserve__V1__Device dev[PP_STAGE_MAX_WORKERS], *devs[PP_STAGE_MAX_WORKERS];
    char names[PP_STAGE_MAX_WORKERS][16];
    for (int r = 0; r < s->tp; r++) {
        ppserve__v1__device__init(&dev[r]);
        int64_t dev_mem;
        pp_devices_describe(&s->devices, r, names[r], sizeof(names[r]), &dev_mem);
        dev[r].name = names[r];
        dev[r].memory_bytes = dev_mem >= 0 ? (uint64_t)dev_mem : mem / (uint64_t)s->tp;
        devs[r] = &dev[r];
    }
    Ppserve__V1__RegisterRequest req = PPSERVE__V1__REGISTER_REQUEST__INIT;
    req.protocol_version = PP_STAGE_PROTOCOL;
    req.advertised_address = s->advertise;
    req.n_devices = (size_t)s->tp;
    req.devices = devs;
    req.tp = (uint32_t)s->tp;
    req.ep = (uint32_t)s->ep;
    req.memory_bytes = mem;
    req.layer_seconds_per_token = 0; /* unknown until a model runs */
    req.compute_threads = (uint32_t)s->cfg.threads;
    req.weight_bytes_per_second = s->weight_bytes_per_second;
    req.kv_budget_bytes = (uint64_t)s->cfg.kv_mb << 20;
    req.instance = s->instance;
    ProtobufCMessage *resp = NULL;
    pp_status st = pp_rpc_call(ch, REGISTER_METHOD, &req.base,
                               &ppserve__v1__register_response__descriptor, REGISTER_DEADLINE_MS,
                               &resp, NULL);
    if (st == PP_OK) {
        s->stage_id = ((Ppserve__V1__RegisterResponse *)resp)->stage_id;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return st;
}

/* Registers, retrying until it works; returns 0 when told to stop first. */
static int register_loop(struct pp_stage *s, struct pp_rpc_channel **ch)
{
    for (uint64_t attempt = 0;; attempt++) {
        pp_status st = *ch ? register_once(s, *ch)
                           : pp_error(PP_ERR_UNAVAILABLE, "no channel to %s", s->cfg.coordinator);
        if (st == PP_OK) {
            PP_INFO("registered: stage_id=%llu coordinator=%s advertised=%s tp=%d ep=%d "
                    "attempts=%llu", (unsigned long long)s->stage_id, s->cfg.coordinator,
                    s->advertise, s->tp, s->ep, (unsigned long long)attempt + 1);
            return 1;
        }
        if (attempt % 10 == 0)
            PP_WARN("register failed: coordinator=%s attempt=%llu detail=\"%s\" (retrying every "
                    "%d ms)", s->cfg.coordinator, (unsigned long long)attempt + 1,
                    pp_error_detail(), REGISTER_RETRY_MS);
        if (!ctl_sleep(s, REGISTER_RETRY_MS))
            return 0;
        if (reconnect(s, ch) != PP_OK)
            PP_ERROR("coordinator channel: %s", pp_error_detail());
    }
}

/* The heartbeat's stats; experts holds the ExpertLoad messages it points to until sent. */
static void fill_stats(struct pp_stage *s, Ppserve__V1__StageStats *st, char *hop_error, size_t n,
                       struct pp_stage_expert_msgs *experts)
{
    st->queue_depth = (uint32_t)pp_stage_queue_len(s);
    st->wall_seconds = pp_clock_mono() - s->serving_since;
    pthread_mutex_lock(&s->stats_mu);
    st->busy_seconds = s->busy_seconds;
    st->bytes_in = s->bytes_in;
    st->bytes_out = s->bytes_out;
    st->kv_blocks_used = s->kv_used;
    st->kv_blocks_total = s->kv_total;
    st->tokens = s->tokens;
    st->bytes_reduced = s->bytes_reduced;
    pp_stage_expert_load_fill(s, st, experts);
    snprintf(hop_error, n, "%s", s->hop_error);
    pthread_mutex_unlock(&s->stats_mu);
}

/* Heartbeats until the coordinator forgets this stage (returns 1: register again) or the thread
 * must stop or leave (returns 0). */
static int heartbeat_loop(struct pp_stage *s, struct pp_rpc_channel **ch)
{
    uint64_t failures = 0;
    for (;;) {
        if (!ctl_sleep(s, s->cfg.heartbeat_ms))
            return 0;
        Ppserve__V1__StageStats stats = PPSERVE__V1__STAGE_STATS__INIT;
        char hop_error[768];
        struct pp_stage_expert_msgs experts;
        fill_stats(s, &stats, hop_error, sizeof(hop_error), &experts);
        Ppserve__V1__HeartbeatRequest req = PPSERVE__V1__HEARTBEAT_REQUEST__INIT;
        req.stage_id = s->stage_id;
        req.stats = &stats;
        req.hop_error = hop_error;
        ProtobufCMessage *resp = NULL;
        pp_status st = *ch ? pp_rpc_call(*ch, HEARTBEAT_METHOD, &req.base,
                                         &ppserve__v1__heartbeat_response__descriptor,
                                         HEARTBEAT_DEADLINE_MS, &resp, NULL)
                           : pp_error(PP_ERR_UNAVAILABLE, "no channel to %s", s->cfg.coordinator);
        pp_stage_expert_msgs_free(&experts);
        if (st != PP_OK) {
            /* one missed beat is routine (the coordinator restarting, or stopping before this
             * stage in `ppserve cluster`): a warning from the third in a row, then every tenth */
            failures++;
            if (failures >= HEARTBEAT_WARN_AFTER && (failures - HEARTBEAT_WARN_AFTER) % 10 == 0)
                PP_WARN("heartbeat failed: coordinator=%s failures=%llu detail=\"%s\"",
                        s->cfg.coordinator, (unsigned long long)failures, pp_error_detail());
            else if (failures < HEARTBEAT_WARN_AFTER)
                PP_INFO("heartbeat failed: coordinator=%s failures=%llu detail=\"%s\"",
                        s->cfg.coordinator, (unsigned long long)failures, pp_error_detail());
            if (reconnect(s, ch) != PP_OK)
                PP_ERROR("coordinator channel: %s", pp_error_detail());
            continue;
        }
        if (failures)
            PP_INFO("heartbeat recovered: coordinator=%s after_failures=%llu", s->cfg.coordinator,
                    (unsigned long long)failures);
        failures = 0;
        int unknown = ((Ppserve__V1__HeartbeatResponse *)resp)->unknown;
        protobuf_c_message_free_unpacked(resp, NULL);
        if (unknown) {
            PP_WARN("coordinator does not know stage_id=%llu (it restarted?): registering again",
                    (unsigned long long)s->stage_id);
            return 1;
        }
    }
}

static void *control_main(void *arg)
{
    struct pp_stage *s = arg;
    struct pp_rpc_channel *ch = NULL;
    if (pp_rpc_channel_new(s->cfg.coordinator, &ch) != PP_OK)
        PP_ERROR("coordinator channel: %s", pp_error_detail());
    int registered = 0;
    while (!ctl_stopped(s) && !atomic_load(&s->leaving)) {
        if (!registered && !(registered = register_loop(s, &ch)))
            break;
        if (!heartbeat_loop(s, &ch))
            break;
        registered = 0; /* forgotten (the coordinator restarted): register again */
    }
    /* a stage the coordinator does not know has nothing to leave */
    if (registered && atomic_load(&s->leaving) && !ctl_stopped(s))
        pp_stage_leave_loop(s, ch);
    pp_rpc_channel_free(ch);
    pthread_mutex_lock(&s->ctl_mu);
    s->left = 1;
    pthread_cond_broadcast(&s->ctl_cv);
    pthread_mutex_unlock(&s->ctl_mu);
    return NULL;
}

pp_status pp_stage_control_start(struct pp_stage *s)
{
    if (pthread_create(&s->control_thread, NULL, control_main, s) != 0)
        return pp_error(PP_ERR_NOMEM, "cannot start the control thread");
    pthread_setname_np(s->control_thread, "control");
    s->control_started = 1;
    return PP_OK;
}

void pp_stage_control_stop(struct pp_stage *s)
{
    pthread_mutex_lock(&s->ctl_mu);
    s->ctl_stop = 1;
    pthread_cond_broadcast(&s->ctl_cv);
    pthread_mutex_unlock(&s->ctl_mu);
    if (s->control_started)
        pthread_join(s->control_thread, NULL);
    s->control_started = 0;
}
