/* ppserve-coordinator: reads its configuration, opens its copy of the model (shapes, tokenizer,
 * identity), serves the client API and the stages' control calls, forms the pipeline once the
 * stages have registered, and then ticks: stage liveness, request deadlines, rates. When a stage
 * dies the pipeline goes down (its requests fail with UNAVAILABLE) and is formed again as soon as
 * enough stages are alive. SIGTERM/SIGINT drain and stop. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "model/identity.h"
#include "model/model.h"
#include "pipeline/model_path.h"

static volatile int g_signal;

static void on_signal(int sig)
{
    g_signal = sig;
}

double co_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double co_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The model as the coordinator needs it: path inside model_root, hyper-parameters, identity,
 * tokenizer, and the byte sizes the planner weighs. */
static pp_status open_model(struct coordinator *co)
{
    char real[PATH_MAX];
    pp_status st = pp_model_path_resolve(co->cfg.model_root, co->cfg.model, real);
    if (st != PP_OK)
        return st;
    snprintf(co->model_path, sizeof(co->model_path), "%s", real);
    st = pp_model_identity(real, co->model_id);
    if (st != PP_OK)
        return st;
    struct pp_model *m;
    if ((st = pp_model_open(real, 0, -1, &m)) != PP_OK)
        return st;
    co->mcfg = m->cfg;
    if (m->last_layer > 0)
        co->layer_bytes = pp_model_layer_bytes(m, 0);
    co->first_bytes = pp_weight_bytes(&m->embedding);
    co->last_bytes = pp_weight_bytes(&m->lm_head);
    pp_model_free(m);
    if (pp_tokenizer_open(real, &co->tok) != PP_OK) {
        PP_INFO("no tokenizer (requests must send prompt_ids): %s", pp_error_detail());
        co->tok = NULL;
    }
    PP_INFO("model name=%s id=%s layers=%d dim=%d vocab=%d context=%d", co->cfg.model,
            co->model_id, co->mcfg.n_layers, co->mcfg.dim, co->mcfg.vocab_size,
            co->mcfg.max_context);
    return PP_OK;
}

static void tick(struct coordinator *co)
{
    pthread_mutex_lock(&co->mu);
    co_check_stages(co);
    co_check_leaving(co);
    co_check_deadlines(co);
    double now = pp_clock_mono();
    if (now - co->rate_t0 >= 2.0) {
        co->tokens_per_s = (double)(co->tokens_generated - co->rate_tokens0) / (now - co->rate_t0);
        co->rate_t0 = now;
        co->rate_tokens0 = co->tokens_generated;
    }
    co_schedule(co);
    pthread_mutex_unlock(&co->mu);
}

/* After a failure: drop the data plane and the dead stages, so that setup can start over. */
static void reset_pipeline(struct coordinator *co)
{
    pthread_mutex_lock(&co->mu);
    struct pp_rpc_stream *hop = co->first_hop;
    co->first_hop = NULL;
    co->deliver = NULL;
    for (int i = 0; i < co->n_stages; i++)
        if (!co->stages[i].alive)
            co_stage_drop(co, i--);
    pthread_mutex_unlock(&co->mu);
    if (hop) {
        pp_rpc_stream_cancel(hop);
        pp_rpc_stream_release(hop);
    }
}

static void usage(const struct pp_coordinator_config *c)
{
    printf("usage: ppserve-coordinator [--config FILE] [--key value ...]\n\nkeys:\n");
    pp_config_usage(pp_coordinator_config_keys, pp_coordinator_config_n_keys, c);
}

int main(int argc, char **argv)
{
    static struct coordinator co_storage;
    struct coordinator *co = &co_storage;
    pp_coordinator_config_defaults(&co->cfg);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(&co->cfg);
            return 0;
        }
    pp_log_init("coordinator", PP_LOG_INFO);
    if (pp_config_from_args(pp_coordinator_config_keys, pp_coordinator_config_n_keys, &co->cfg,
                            argc - 1, argv + 1) != PP_OK ||
        pp_coordinator_config_check(&co->cfg) != PP_OK) {
        fprintf(stderr, "ppserve-coordinator: error: %s\n", pp_error_detail());
        return 2;
    }
    pp_log_init("coordinator", (enum pp_log_level)pp_log_level_parse(co->cfg.log_level));
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    pthread_mutex_init(&co->mu, NULL);
    pthread_cond_init(&co->cond, NULL);
    co->interrupted = &g_signal;
    co->queued.next = co->queued.prev = &co->queued;
    co->running.next = co->running.prev = &co->running;
    co->in_flight = pp_calloc(PP_MEM_MISC, 512, sizeof(*co->in_flight));
    co->trace = pp_calloc(PP_MEM_MISC, CO_TRACE_KEEP, sizeof(*co->trace));
    snprintf(co->state_reason, sizeof(co->state_reason), "starting");
    int rc = 1;
    if (!co->in_flight || !co->trace) {
        fprintf(stderr, "ppserve-coordinator: error: out of memory\n");
        goto out;
    }
    if (open_model(co) != PP_OK) {
        fprintf(stderr, "ppserve-coordinator: error: %s\n", pp_error_detail());
        goto out;
    }
    pp_rpc_init();
    struct pp_rpc_server_opts so = {.listen = co->cfg.listen, .threads = 2};
    pp_status st;
    if ((st = pp_rpc_server_new(&so, &co->server)) != PP_OK ||
        (st = pp_rpc_health_add(co->server, &co->health)) != PP_OK ||
        (st = co_registry_add(co)) != PP_OK || (st = co_leave_add(co)) != PP_OK ||
        (st = co_client_api_add(co)) != PP_OK ||
        (st = co_deliver_add(co)) != PP_OK || (st = pp_rpc_server_start(co->server, &co->port)) !=
                                                  PP_OK) {
        fprintf(stderr, "ppserve-coordinator: error: %s\n", pp_error_detail());
        goto out_rpc;
    }
    pp_rpc_health_set(co->health, "ppserve.v1.Ppserve", PP_HEALTH_NOT_SERVING);
    PP_INFO("coordinator listening on %s (port %d), waiting for %lld stages", co->cfg.listen,
            co->port, (long long)co->cfg.stages);
    if (co_release_start(co) != PP_OK) {
        fprintf(stderr, "ppserve-coordinator: error: %s\n", pp_error_detail());
        goto out_rpc;
    }

    /* serve: form the pipeline, tick while it serves, form it again after a failure */
    while (!g_signal) {
        st = co_setup_pipeline(co);
        if (st != PP_OK && !g_signal) {
            pthread_mutex_lock(&co->mu);
            int blocked = co->blocked;
            pthread_mutex_unlock(&co->mu);
            /* blocked: a person must act; otherwise it is retried (a dead stage's address while
             * its silence is measured, a stage still loading): a warning */
            PP_LOG(blocked ? PP_LOG_ERROR : PP_LOG_WARN, "pipeline not formed: %s",
                   pp_error_detail());
            /* a refusal is not retried until something changes (a stage restarted with another
             * configuration, a stage gone) or the retry period passes (a model file replaced),
             * another failure after a second. Both waits check the stages' liveness every 200 ms
             * and end early when a stage registers, leaves or goes silent: a stage that died
             * while serving broke a hop before it missed its heartbeats, so it is still
             * registered here; once silent for stage_timeout_ms it is marked dead and
             * reset_pipeline drops it, which lets a replacement on another address register
             * (registration refuses stages beyond cfg.stages) */
            co_setup_wait_change(co, blocked ? CO_BLOCKED_RETRY_S : 1.0);
            reset_pipeline(co);
            continue;
        }
        while (!g_signal) {
            usleep(100 * 1000);
            tick(co);
            pthread_mutex_lock(&co->mu);
            int down = co->state == CO_DOWN;
            pthread_mutex_unlock(&co->mu);
            if (down)
                break;
        }
        if (!g_signal) {
            /* stages of the failed pipeline stay registered; setup reassigns them */
            reset_pipeline(co);
        }
    }
    rc = 0;
    PP_INFO("stopping (signal %d): draining for up to %lld ms", (int)g_signal,
            (long long)co->cfg.grace_ms);
    pthread_mutex_lock(&co->mu);
    co->draining = 1;
    pp_rpc_health_set(co->health, "", PP_HEALTH_NOT_SERVING);
    pp_rpc_health_set(co->health, "ppserve.v1.Ppserve", PP_HEALTH_NOT_SERVING);
    pthread_mutex_unlock(&co->mu);
    /* let running requests finish within the grace period; new ones are refused meanwhile */
    for (double t0 = pp_clock_mono(); pp_clock_mono() - t0 < (double)co->cfg.grace_ms / 1000.0;) {
        pthread_mutex_lock(&co->mu);
        /* requests waiting for a new pipeline (failover) will not get one now */
        int busy = co->state == CO_SERVING ? co->n_running + co->n_queued : 0;
        pthread_mutex_unlock(&co->mu);
        if (!busy)
            break;
        usleep(50 * 1000);
        tick(co);
    }
    pthread_mutex_lock(&co->mu);
    co->state = CO_STOPPING;
    snprintf(co->state_reason, sizeof(co->state_reason), "the coordinator is stopping");
    co_fail_all(co, PP_ERR_UNAVAILABLE, "the coordinator is stopping");
    /* end the last stage's result stream in order (OK), so that it can tell a coordinator that
     * stops from one that vanished */
    if (co->deliver)
        pp_rpc_stream_finish(co->deliver, PP_OK, "the coordinator is stopping");
    pthread_mutex_unlock(&co->mu);
    co_release_stop(co);
    reset_pipeline(co);
out_rpc:
    if (co->server)
        pp_rpc_server_free(co->server, 2000);
    pp_rpc_health_free(co->health);
    for (int i = 0; i < co->n_stages; i++) {
        pp_rpc_channel_free(co->stages[i].ch);
        co_stage_forget_experts(&co->stages[i]);
    }
    for (int i = 0; i < co->n_retired; i++)
        pp_rpc_channel_free(co->retired[i]);
    pp_rpc_shutdown();
out:
    pp_tokenizer_free(co->tok);
    pp_free(PP_MEM_MISC, co->in_flight);
    pp_free(PP_MEM_MISC, co->trace);
    pp_free(PP_MEM_MISC, co->release_q);
    return rc;
}
