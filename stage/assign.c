/* Assign and Release, the coordinator's control of a stage. Assign checks the request against this
 * host (the model name stays inside the model root, the copy there has the coordinator's identity,
 * the stage's tp/ep split the model, the layer range fits the model, the next hop matches the
 * range), drops the previous assignment, opens the model range with tp worker backends on the
 * stage's devices (CPU shards sharing the threads, or one GPU each) and a tensor-parallel executor,
 * and opens the outgoing hop. Loading runs in the handler: the server has more than one thread, so
 * other calls are answered meanwhile. Release frees sequences' KV and token history. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/limits.h"
#include "common/log.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/shard.h"
#include "pipeline/model_path.h"
#include "stage/stage.h"

#define HOP_CLOSE_MS 2000 /* how long a reassignment waits for the old hop to end */

/* realpath(root/name) into out, which must lie inside realpath(root). */
/* Everything that can be checked before the current assignment is dropped. */
static pp_status validate(struct pp_stage *s, const Ppserve__V1__Assignment *m,
                          char path[PATH_MAX], char id[PP_MODEL_ID_LEN], int32_t *n_layers)
{
    pp_status st = pp_model_path_resolve(s->cfg.model_root, m->model, path);
    if (st != PP_OK)
        return st;
    if ((st = pp_model_identity(path, id)) != PP_OK)
        return pp_stage_error_wrap(st, "model '%s'", m->model);
    if (!m->model_id || strcmp(m->model_id, id) != 0)
        return pp_error(PP_ERR_PRECONDITION, "model identity differs: the coordinator serves %s, "
                        "this stage's copy of %s is %s",
                        m->model_id && m->model_id[0] ? m->model_id : "(none)", m->model, id);
    struct pp_model_config cfg;
    if ((st = pp_model_read_config(path, &cfg)) != PP_OK)
        return pp_stage_error_wrap(st, "model '%s'", m->model);
    *n_layers = cfg.n_layers;
    /* the stage's own degrees must split this model: refused before anything is dropped */
    if ((st = pp_shard_check(&cfg, s->tp, s->ep, path)) != PP_OK)
        return pp_stage_error_wrap(st, "tp %d, ep %d (this stage's keys)", s->tp, s->ep);
    if (m->first_layer < 0 || m->last_layer <= m->first_layer || m->last_layer > cfg.n_layers)
        return pp_error(PP_ERR_INVALID_ARG, "layers [%d, %d): expected a non-empty range inside "
                        "the model's [0, %d)", m->first_layer, m->last_layer, cfg.n_layers);
    if (m->n_stages < 1 || m->index >= m->n_stages)
        return pp_error(PP_ERR_INVALID_ARG, "stage index %u of %u stages: expected an index below "
                        "the stage count", m->index, m->n_stages);
    int last = m->last_layer == cfg.n_layers;
    const char *next = m->next_hop ? m->next_hop : "";
    if (last && next[0])
        return pp_error(PP_ERR_INVALID_ARG, "layers [%d, %d) end the model, so this stage sends "
                        "results to the coordinator; expected no next hop, got %s",
                        m->first_layer, m->last_layer, next);
    if (!last && !next[0])
        return pp_error(PP_ERR_INVALID_ARG, "layers [%d, %d) end before the model's last layer "
                        "%d: expected a next hop, got none", m->first_layer, m->last_layer,
                        cfg.n_layers);
    if (!last && (st = pp_config_check_address("next_hop", next)) != PP_OK)
        return st;
    /* "" = deliver to the coordinator address this stage was configured with */
    if (last && m->coordinator && m->coordinator[0] &&
        (st = pp_config_check_address("coordinator", m->coordinator)) != PP_OK)
        return st;
    if (m->max_batch_tokens > (1u << 16))
        return pp_error(PP_ERR_INVALID_ARG, "max_batch_tokens: expected at most %u, got %u",
                        1u << 16, m->max_batch_tokens);
    if (m->kv_budget_bytes > (uint64_t)INT64_MAX)
        return pp_error(PP_ERR_INVALID_ARG, "kv_budget_bytes: %llu is too large",
                        (unsigned long long)m->kv_budget_bytes);
    return PP_OK;
}

static void asg_free(struct pp_stage_assignment *a, int hop_timeout_ms)
{
    if (!a)
        return;
    pp_stage_out_close(a->out, hop_timeout_ms);
    pp_executor_free(a->ex);
    pp_backend_free_all(a->bes, a->n_workers);
    pp_model_free(a->model);
    pp_sampler_free(a->sampler);
    pp_stage_history_free(a->history);
    pp_free(PP_MEM_MISC, a->seqs);
    pp_free(PP_MEM_ACTIVATIONS, a->hidden);
    pp_free(PP_MEM_ACTIVATIONS, a->logits);
    pp_free(PP_MEM_MISC, a);
}

/* cpu_weights = copy holds a copy of the range's weights beside the KV budget; where that does not
 * fit the memory this process may use (the coordinator's plan leaves room for both and
 * PP_MEMORY_HEADROOM, but an Assign may come from elsewhere), the weights are used from the
 * mapped file instead of the kernel killing the stage mid-load. Returns 1 to map. */
static int copy_would_not_fit(const struct pp_stage *s, const struct pp_model *m,
                              int64_t kv_bytes)
{
    char why[1024];
    if (pp_memory_fits(&s->memory, (uint64_t)pp_model_weight_bytes(m), (uint64_t)kv_bytes, why,
                       sizeof(why)))
        return 0;
    PP_WARN("cpu_weights=copy: %s; computing from the mapped model file instead (cpu_weights = "
            "\"map\")", why);
    return 1;
}

/* The KV budget a CPU stage holds: the Assign's, or less where that and PP_MEMORY_HEADROOM would
 * pass the memory this process may use (an Assign not planned by this coordinator, whose plan
 * leaves room). The cache is allocated at once, but its pages are taken as sequences fill it, so
 * an oversized cache would get the stage killed under load, long after the Assign. */
static int64_t kv_that_fits(const struct pp_stage *s, int64_t kv_bytes)
{
    uint64_t usable = s->memory.usable;
    if (pp_memory_fits(&s->memory, 0, (uint64_t)kv_bytes, NULL, 0))
        return kv_bytes;
    int64_t room = usable > PP_MEMORY_HEADROOM ? (int64_t)(usable - PP_MEMORY_HEADROOM) : 0;
    char line[768];
    pp_memory_describe(&s->memory, line, sizeof(line));
    PP_WARN("kv budget: %.1f MiB asked for, more than this process may use beside 64 MiB for "
            "the rest (%s): holding %.1f MiB", (double)kv_bytes / (1 << 20), line,
            (double)room / (1 << 20));
    return room;
}

static pp_status load(struct pp_stage *s, const Ppserve__V1__Assignment *m, const char *path,
                      const char *id, int32_t n_layers, struct pp_stage_assignment **out)
{
    struct pp_stage_assignment *a = pp_calloc(PP_MEM_MISC, 1, sizeof(*a));
    if (!a)
        return pp_error(PP_ERR_NOMEM, "no memory for an assignment");
    a->index = m->index;
    a->stage_id = m->stage_id;
    a->n_stages = m->n_stages;
    snprintf(a->model_name, sizeof(a->model_name), "%s", m->model);
    snprintf(a->path, sizeof(a->path), "%s", path);
    snprintf(a->model_id, sizeof(a->model_id), "%s", id);
    a->first_layer = m->first_layer;
    a->last_layer = m->last_layer;
    a->n_layers = n_layers;
    a->max_batch_tokens = m->max_batch_tokens > 0 ? (int32_t)m->max_batch_tokens
                                                  : (int32_t)s->cfg.max_batch_tokens;
    a->n_workers = s->tp;
    pp_status st = pp_model_open(path, m->first_layer, m->last_layer, &a->model);
    if (st == PP_OK)
        st = pp_backends_new(&s->devices, (int)s->cfg.threads, a->n_workers, a->bes);
    if (st == PP_OK) {
        struct pp_executor_opts eo = {0};
        eo.max_batch_tokens = a->max_batch_tokens;
        eo.kv_budget_bytes = m->kv_budget_bytes > 0 ? (int64_t)m->kv_budget_bytes
                                                    : s->cfg.kv_mb * ((int64_t)1 << 20);
        int map = 0;
        (void)pp_cpu_weights_parse(s->cfg.cpu_weights, &map); /* checked at start-up */
        if (!map && s->devices.kind == PP_DEVICE_CPU)
            map = copy_would_not_fit(s, a->model, eo.kv_budget_bytes);
        if (s->devices.kind == PP_DEVICE_CPU)
            eo.kv_budget_bytes = kv_that_fits(s, eo.kv_budget_bytes);
        for (int r = 0; r < a->n_workers; r++)
            pp_backend_cpu_map_weights(a->bes[r], map);
        eo.max_seqs = PP_STAGE_MAX_SEQS;
        eo.ep = s->ep;
        st = pp_executor_new_workers(a->model, a->bes, a->n_workers, &eo, &a->ex);
    }
    if (st == PP_OK) {
        a->dim = a->model->cfg.dim;
        a->vocab = a->model->cfg.vocab_size;
        a->first = a->model->has_embedding;
        a->last = a->model->has_head;
        a->max_bytes = (uint64_t)a->max_batch_tokens * (uint64_t)a->dim * 4u + PP_STAGE_SLACK_BYTES;
    }
    if (st == PP_OK && a->last && (st = pp_sampler_new(a->vocab, &a->sampler)) == PP_OK)
        st = pp_stage_history_new(&a->history);
    if (st == PP_OK) {
        /* room for two of the largest microbatches' chunks before a send waits */
        size_t chunks = (size_t)((a->max_bytes + PP_RPC_CHUNK_BYTES - 1) / PP_RPC_CHUNK_BYTES);
        size_t max_queued = 2 * chunks < 8 ? 8 : 2 * chunks;
        const char *to = m->coordinator && m->coordinator[0] ? m->coordinator : s->cfg.coordinator;
        st = a->last ? pp_stage_out_open(s, to, 1, id, 0, max_queued, &a->out)
                     : pp_stage_out_open(s, m->next_hop, 0, id, m->last_layer, max_queued, &a->out);
    }
    if (st == PP_OK && a->last) {
        /* an empty Results (microbatch 0) names this stage on the stream before any result, so
         * the coordinator notices at once if the stream breaks */
        Ppserve__V1__Results hello = PPSERVE__V1__RESULTS__INIT;
        hello.stage_id = a->stage_id;
        struct pp_rpc_msg *hm;
        st = pp_rpc_msg_pack(&hello.base, &hm);
        if (st == PP_OK)
            st = pp_stage_out_send(a->out, hm);
    }
    if (st != PP_OK) {
        char why[1024];
        snprintf(why, sizeof(why), "%s", pp_error_detail());
        asg_free(a, HOP_CLOSE_MS);
        return pp_error(st, "%s", why);
    }
    *out = a;
    return PP_OK;
}

void pp_stage_update_stats(struct pp_stage *s)
{
    uint32_t used = 0, total = 0;
    if (s->asg) {
        const struct pp_kv_cache *kv = pp_executor_kv(s->asg->ex);
        total = (uint32_t)kv->n_blocks;
        used = (uint32_t)(kv->n_blocks - kv->n_free);
    }
    pthread_mutex_lock(&s->stats_mu);
    s->kv_used = used;
    s->kv_total = total;
    pthread_mutex_unlock(&s->stats_mu);
    pp_stage_expert_load_update(s);
}

/* Drops the current assignment: no new hop may open on it, the compute thread lets go of it (its
 * queued microbatches are then acked as stale), its inbound streams end with status. */
static void teardown(struct pp_stage *s, pp_status status, const char *why, int hop_timeout_ms)
{
    pthread_mutex_lock(&s->info_mu);
    s->info.assigned = 0;
    pthread_mutex_unlock(&s->info_mu);
    pthread_mutex_lock(&s->mu);
    struct pp_stage_assignment *old = s->asg;
    s->asg = NULL;
    pp_stage_update_stats(s);
    pthread_mutex_unlock(&s->mu);
    if (!old)
        return;
    pp_stage_inbound_finish_all(s, 0, old->gen, status, why);
    PP_INFO("unassigned: model=%s layers=%d..%d reason=\"%s\"", old->model_name,
            old->first_layer, old->last_layer, why);
    asg_free(old, hop_timeout_ms);
}

void pp_stage_unassign(struct pp_stage *s, int timeout_ms)
{
    pthread_mutex_lock(&s->assign_mu);
    teardown(s, PP_ERR_UNAVAILABLE, "this stage is shutting down", timeout_ms);
    pthread_mutex_unlock(&s->assign_mu);
}

pp_status pp_stage_assign_handler(void *ud, const ProtobufCMessage *req, struct pp_buf *resp)
{
    struct pp_stage *s = ud;
    const Ppserve__V1__Assignment *m = (const Ppserve__V1__Assignment *)req;
    if (atomic_load(&s->draining) || atomic_load(&s->leaving))
        return pp_error(PP_ERR_UNAVAILABLE, "this stage is shutting down");
    char path[PATH_MAX], id[PP_MODEL_ID_LEN];
    int32_t n_layers = 0;
    pthread_mutex_lock(&s->assign_mu);
    double t0 = pp_clock_mono();
    pp_status st = validate(s, m, path, id, &n_layers);
    if (st != PP_OK) {
        PP_WARN("assign refused: model=%s layers=%d..%d code=%s detail=\"%s\"",
                m->model ? m->model : "", m->first_layer, m->last_layer,
                pp_rpc_code_name(pp_rpc_code_from_status(st)), pp_error_detail());
        pthread_mutex_unlock(&s->assign_mu);
        return st;
    }
    teardown(s, PP_ERR_PRECONDITION, "this stage was reassigned (expected a new stream with a new "
             "handshake)", HOP_CLOSE_MS);
    struct pp_stage_assignment *a = NULL;
    if ((st = load(s, m, path, id, n_layers, &a)) != PP_OK) {
        PP_ERROR("assign failed: model=%s layers=%d..%d detail=\"%s\"", m->model,
                 m->first_layer, m->last_layer, pp_error_detail());
        pthread_mutex_unlock(&s->assign_mu);
        return st;
    }
    a->gen = ++s->next_gen;
    pthread_mutex_lock(&s->stats_mu);
    s->hop_error[0] = '\0';
    pthread_mutex_unlock(&s->stats_mu);
    pthread_mutex_lock(&s->mu);
    s->asg = a;
    pp_stage_update_stats(s);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->info_mu);
    s->info.assigned = 1;
    s->info.gen = a->gen;
    snprintf(s->info.model_id, sizeof(s->info.model_id), "%s", a->model_id);
    s->info.first_layer = a->first_layer;
    s->info.dim = a->dim;
    s->info.max_bytes = a->max_bytes;
    pthread_mutex_unlock(&s->info_mu);

    const struct pp_kv_cache *kv = pp_executor_kv(a->ex);
    Ppserve__V1__AssignResponse r = PPSERVE__V1__ASSIGN_RESPONSE__INIT;
    r.kv_blocks = (uint32_t)kv->n_blocks;
    r.kv_block_tokens = (uint32_t)kv->view.block_size;
    r.weight_bytes = (uint64_t)pp_model_weight_bytes(a->model);
    r.max_seqs = (uint32_t)kv->max_seqs;
    r.max_context = pp_executor_max_context(a->ex);
    r.instance = s->instance;
    PP_INFO("assigned: index=%u n_stages=%u model=%s id=%s layers=%d..%d next=%s kv_blocks=%u "
            "block_tokens=%u weight_bytes=%llu max_batch_tokens=%d tp=%d ep=%d load_s=%.3f",
            a->index, a->n_stages, a->model_name, a->model_id, a->first_layer, a->last_layer,
            a->out->target, r.kv_blocks, r.kv_block_tokens, (unsigned long long)r.weight_bytes,
            a->max_batch_tokens, s->tp, s->ep, pp_clock_mono() - t0);
    pthread_mutex_unlock(&s->assign_mu);
    return pp_rpc_pack(&r.base, resp);
}

pp_status pp_stage_release_handler(void *ud, const ProtobufCMessage *req, struct pp_buf *resp)
{
    struct pp_stage *s = ud;
    const Ppserve__V1__ReleaseRequest *m = (const Ppserve__V1__ReleaseRequest *)req;
    uint32_t released = 0;
    pthread_mutex_lock(&s->mu);
    struct pp_stage_assignment *a = s->asg;
    for (size_t i = 0; a && i < m->n_seq_ids; i++) {
        int had = pp_executor_release(a->ex, m->seq_ids[i]);
        if (a->history)
            had |= pp_stage_history_release(a->history, m->seq_ids[i]);
        released += had != 0;
    }
    pp_stage_update_stats(s);
    pthread_mutex_unlock(&s->mu);
    PP_DEBUG("release: asked=%zu released=%u", m->n_seq_ids, released);
    Ppserve__V1__ReleaseResponse r = PPSERVE__V1__RELEASE_RESPONSE__INIT;
    r.released = released;
    return pp_rpc_pack(&r.base, resp);
}
