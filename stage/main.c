/* ppserve-stage: a pipeline stage. It reads its configuration (file, then flags), serves
 * ppserve.v1.Stage and grpc.health.v1.Health, measures its speed, registers with the coordinator
 * and waits for an assignment; microbatches then flow in on Forward streams and out to the next
 * hop. SIGTERM or SIGINT drains it within grace_ms: health NOT_SERVING; the coordinator is asked to
 * let the stage leave and finishes the pipeline's requests meanwhile (leave.c); then no new
 * microbatches, the queued ones finish, the hop closes, the server stops, exit 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/nonce.h"
#include "stage/stage.h"

#define SERVER_THREADS 2

static void usage(void)
{
    struct pp_stage_config d;
    pp_stage_config_defaults(&d);
    printf("usage: ppserve-stage [--config FILE] --coordinator HOST:PORT [--listen HOST:PORT]\n"
           "                     [--advertise HOST:PORT] [--model_root DIR] [--key value ...]\n\n"
           "A pipeline stage: registers with the coordinator, loads the layer range it is\n"
           "assigned and streams activations to the next stage. Flags override the file.\n\n");
    pp_config_usage(pp_stage_config_keys, pp_stage_config_n_keys, &d);
}

/* The address others reach this stage at: --advertise, or the listen host with the bound port (a
 * wildcard host becomes 127.0.0.1, which only works on one machine). */
static void advertised_address(struct pp_stage *s, int port)
{
    if (s->cfg.advertise[0]) {
        snprintf(s->advertise, sizeof(s->advertise), "%s", s->cfg.advertise);
        return;
    }
    char host[PP_CFG_STR_MAX];
    snprintf(host, sizeof(host), "%s", s->cfg.listen);
    char *colon = strrchr(host, ':');
    if (colon)
        *colon = '\0';
    if (!host[0] || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "[::]") == 0 ||
        strcmp(host, "::") == 0 || strcmp(host, "*") == 0) {
        PP_WARN("listen host '%s' is a wildcard: advertising 127.0.0.1 (set --advertise for other "
                "hosts to reach this stage)", host);
        snprintf(host, sizeof(host), "127.0.0.1");
    }
    snprintf(s->advertise, sizeof(s->advertise), "%s:%d", host, port);
}

static pp_status serve(struct pp_stage *s)
{
    struct pp_rpc_server_opts o = {s->cfg.listen, SERVER_THREADS, 0};
    pp_status st = pp_rpc_server_new(&o, &s->server);
    if (st != PP_OK)
        return st;
    int port = 0;
    if ((st = pp_rpc_server_add_unary(s->server, "/ppserve.v1.Stage/Assign",
                                      &ppserve__v1__assignment__descriptor,
                                      pp_stage_assign_handler, s)) != PP_OK ||
        (st = pp_rpc_server_add_unary(s->server, "/ppserve.v1.Stage/Release",
                                      &ppserve__v1__release_request__descriptor,
                                      pp_stage_release_handler, s)) != PP_OK ||
        (st = pp_rpc_server_add_stream(s->server, "/ppserve.v1.Stage/Forward",
                                       pp_stage_forward_open, &pp_stage_forward_cbs, s)) != PP_OK ||
        (st = pp_rpc_health_add(s->server, &s->health)) != PP_OK ||
        (st = pp_rpc_server_start(s->server, &port)) != PP_OK)
        return st;
    advertised_address(s, port);
    pp_rpc_health_set(s->health, "", PP_HEALTH_SERVING);
    pp_rpc_health_set(s->health, "ppserve.v1.Stage", PP_HEALTH_SERVING);
    return PP_OK;
}

static void context_init(struct pp_stage *s)
{
    /* a new process on an old one's address can be assigned layers before it registers (the
     * coordinator retries the address it knows); by this number the coordinator tells that the
     * process registering holds them, not that the old one restarted */
    s->instance = pp_nonce64();
    pthread_mutex_init(&s->assign_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->info_mu, NULL);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_mutex_init(&s->ctl_mu, NULL);
    pthread_mutex_init(&s->stats_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    pp_stage_cond_init(&s->idle_cv);
    pp_stage_cond_init(&s->ctl_cv);
}

static void context_free(struct pp_stage *s)
{
    pthread_mutex_destroy(&s->assign_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->info_mu);
    pthread_mutex_destroy(&s->q_mu);
    pthread_mutex_destroy(&s->ctl_mu);
    pthread_mutex_destroy(&s->stats_mu);
    pp_stage_expert_load_free(s->experts);
    pthread_cond_destroy(&s->q_cv);
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->ctl_cv);
    pp_free(PP_MEM_MISC, s);
}

static int ms_left(double deadline, int floor_ms)
{
    double left = (deadline - pp_clock_mono()) * 1000.0;
    return left > floor_ms ? (int)left : floor_ms;
}

/* Drains and stops everything main started, each step bounded by the grace period or its own
 * deadline. sig: the signal that stops it (0: a failed start, nothing to leave); sigs: those that
 * cut the leave short. */
static void shutdown_stage(struct pp_stage *s, int sig, const sigset_t *sigs)
{
    double deadline = pp_clock_mono() + (double)s->cfg.grace_ms / 1000.0;
    if (s->health) {
        pp_rpc_health_set(s->health, "", PP_HEALTH_NOT_SERVING);
        pp_rpc_health_set(s->health, "ppserve.v1.Stage", PP_HEALTH_NOT_SERVING);
    }
    if (sig)
        pp_stage_leave(s, deadline, pp_stage_signal_name(sig), sigs);
    atomic_store(&s->draining, 1);
    if (!pp_stage_queue_wait_idle(s, deadline))
        PP_WARN("drain: grace_ms=%lld over with %zu microbatches queued: they are dropped",
                (long long)s->cfg.grace_ms, pp_stage_queue_len(s));
    atomic_store(&s->abandon, 1);
    pp_stage_compute_stop(s);
    pp_stage_queue_flush(s, PP_ERR_UNAVAILABLE, "the stage shut down before computing it");
    pp_stage_control_stop(s);
    /* in order (OK): the previous hop tells an orderly stop from a crash by it */
    pp_stage_inbound_finish_all(s, 1, 0, PP_OK, "this stage is shutting down");
    pp_stage_unassign(s, ms_left(deadline, 500));
    pp_rpc_server_free(s->server, ms_left(deadline, 100));
    s->server = NULL;
    pp_rpc_health_free(s->health);
    s->health = NULL;
    /* every stream's on_end ran before the server's threads stopped */
    pthread_mutex_lock(&s->q_mu);
    struct pp_stage_inbound *left = s->inbound;
    pthread_mutex_unlock(&s->q_mu);
    if (left)
        PP_ERROR("shutdown: inbound streams still referenced (refs=%d)", left->refs);
}

/* The key `devices` on this host, before anything starts: an explicit GPU list that cannot be used
 * stops the stage; "auto" without usable GPUs runs on the CPU and says why. */
static pp_status resolve_devices(struct pp_stage *s)
{
    pp_stage_config_degrees(&s->cfg, &s->tp, &s->ep);
    struct pp_device_spec want;
    char note[512];
    pp_status st = pp_device_spec_parse(s->cfg.devices, &want);
    if (st == PP_OK)
        st = pp_devices_resolve(&want, s->tp, &s->devices, note, sizeof(note));
    if (st != PP_OK)
        return st;
    pp_device_spec_format(&s->devices, s->devices_used, sizeof(s->devices_used));
    if (note[0])
        PP_INFO("device=%s requested=%s reason=\"no GPU is used: %s\"", s->devices_used,
                s->cfg.devices, note);
    else
        PP_INFO("device=%s requested=%s", s->devices_used, s->cfg.devices);
    return PP_OK;
}

/* What the stage may use of its host, logged: the memory it offers the coordinator
 * (stage/register.c), and its CPUs. threads = 0: one per usable CPU; more than those: a warning
 * (CPU stages). */
static void resolve_limits(struct pp_stage *s)
{
    struct pp_cpus cpus;
    char line[1024], warn[1024];
    pp_memory_read(&s->memory);
    pp_memory_describe(&s->memory, line, sizeof(line));
    PP_INFO("memory: %s", line);
    uint64_t share = (uint64_t)s->cfg.memory_mb << 20;
    if (share > 0 && share <= s->memory.usable) {
        s->memory.usable = s->memory.limit = share;
        snprintf(s->memory.limit_file, sizeof(s->memory.limit_file), "the stage's memory_mb = %lld",
                 (long long)s->cfg.memory_mb);
        PP_INFO("memory offered: %lld MiB (memory_mb)", (long long)s->cfg.memory_mb);
    } else if (share > 0) {
        PP_WARN("memory_mb = %lld is more than this process may use (%s): offering %.1f MiB",
                (long long)s->cfg.memory_mb, line,
                (double)s->memory.usable / (1024.0 * 1024.0));
    }
    pp_cpus_read(&cpus);
    pp_cpus_describe(&cpus, line, sizeof(line));
    PP_INFO("cpus: %s", line);
    s->cfg.threads = pp_cpus_threads(&cpus, (int)s->cfg.threads, warn, sizeof(warn));
    if (s->devices.kind == PP_DEVICE_CPU && warn[0])
        PP_WARN("%s", warn);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage();
            return 0;
        }
    struct pp_stage *s = pp_calloc(PP_MEM_MISC, 1, sizeof(*s));
    if (!s) {
        fprintf(stderr, "ppserve-stage: error: out of memory\n");
        return 1;
    }
    pp_stage_config_defaults(&s->cfg);
    pp_status st = pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &s->cfg,
                                       argc - 1, argv + 1);
    if (st == PP_OK)
        st = pp_stage_config_check(&s->cfg);
    if (st == PP_OK && s->cfg.advertise[0])
        st = pp_config_check_address("advertise", s->cfg.advertise);
    if (st != PP_OK) {
        fprintf(stderr, "ppserve-stage: error: %s\n",
                pp_error_detail()[0] ? pp_error_detail() : pp_strerror(st));
        fprintf(stderr, "(see ppserve-stage --help)\n");
        pp_free(PP_MEM_MISC, s);
        return 2;
    }
    pp_log_init("stage", (enum pp_log_level)pp_log_level_parse(s->cfg.log_level));
    if (resolve_devices(s) != PP_OK) {
        fprintf(stderr, "ppserve-stage: error: key 'devices': %s\n", pp_error_detail());
        pp_free(PP_MEM_MISC, s);
        return 1;
    }
    resolve_limits(s);

    /* signals are taken by sigwait in this thread only: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (!pp_alloc_keep_large_buffers()) /* e.g. a sanitizer's allocator: only speed suffers */
        PP_INFO("the C library refused to keep large buffers in its heap: each microbatch's "
                "activations are mapped afresh (slower hops)");

    context_init(s);
    int rc = 0, sig = 0;
    if ((st = serve(s)) != PP_OK) {
        PP_ERROR("cannot serve: listen=%s detail=\"%s\"", s->cfg.listen, pp_error_detail());
        rc = 1;
        goto out;
    }
    s->serving_since = pp_clock_mono();
    PP_INFO("stage listening on %s", s->advertise);
    PP_INFO("workers: tp=%d ep=%d threads=%lld devices=%s cpu_weights=%s", s->tp, s->ep,
            (long long)s->cfg.threads, s->devices_used, s->cfg.cpu_weights);
    if (s->devices.kind == PP_DEVICE_CPU && s->tp > s->cfg.threads)
        PP_WARN("tp %d with %lld threads: each worker still runs one thread, so %d threads share "
                "the cores", s->tp, (long long)s->cfg.threads, s->tp);
    if (pp_stage_probe(&s->devices, (int)s->cfg.threads, s->tp, s->memory.usable,
                       &s->weight_bytes_per_second) != PP_OK)
        PP_WARN("probe failed: %s (reporting speed 0)", pp_error_detail());
    if ((st = pp_stage_compute_start(s)) != PP_OK || (st = pp_stage_control_start(s)) != PP_OK) {
        PP_ERROR("%s", pp_error_detail());
        rc = 1;
        goto out;
    }
    while (sigwait(&sigs, &sig) != 0)
        ;
    PP_INFO("stopping: signal=%s grace_ms=%lld", pp_stage_signal_name(sig),
            (long long)s->cfg.grace_ms);
out:
    shutdown_stage(s, sig, &sigs);
    if (rc == 0)
        PP_INFO("stopped");
    context_free(s);
    return rc;
}
