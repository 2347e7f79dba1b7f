/* The layer-range executor: batch validation, KV bookkeeping, windows of rows, and the workers that
 * run each window (executor_layer.c). Scratch buffers are sized once for max_batch_tokens rows;
 * larger batches run in windows, which changes nothing in any token's arithmetic. With W > 1
 * workers the window runs on a pool of W threads (the caller is worker 0), one per worker. */
#include "model/executor.h"

#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "model/executor-impl.h"

static void *scratch(int64_t n, size_t elem)
{
    return pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)n * elem);
}

/* The worker's buffers in its backend's memory, in one table for allocation and release. */
#define WORKER_BUFS(w)                                                                             \
    {&(w)->x, &(w)->xb, &(w)->q, &(w)->k, &(w)->v, &(w)->att, &(w)->gate, &(w)->up, &(w)->logits,  \
     &(w)->moe_out}

static void worker_free(struct pp_executor *ex, struct pp_exec_worker *w)
{
    struct pp_backend *be = w->be;
    if (!be)
        return;
    float **bufs[] = WORKER_BUFS(w);
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        be->ops->buf_free(be, PP_MEM_ACTIVATIONS, *bufs[i]);
    be->ops->buf_free(be, PP_MEM_KV, w->kv_pool);
    pp_moe_scratch_free(w->moe);
    pp__exec_weights_free(ex, w);
    pp_shard_free(w->shard);
}

/* Worker r's shard, weights, KV pool and scratch for T rows, in its backend's memory. */
static pp_status worker_init(struct pp_executor *ex, struct pp_exec_worker *w, int32_t rank,
                             struct pp_backend *be)
{
    const struct pp_model *m = ex->m;
    const struct pp_model_config *c = &m->cfg;
    w->rank = rank;
    w->be = be;
    pp_status st = pp_shard_new(m, ex->n_workers, ex->ep, rank, &w->shard);
    if (st != PP_OK || (st = pp__exec_weights_load(ex, w)) != PP_OK)
        return st;
    const struct pp_shard *s = w->shard;
    w->kv = ex->kv->view;
    int64_t pool_bytes = (int64_t)ex->kv->n_blocks *
                         pp_kv_block_bytes(w->kv.n_layers, w->kv.kv_dim, w->kv.block_size);
    if ((st = be->ops->buf_alloc(be, PP_MEM_KV, pool_bytes, (void **)&w->kv_pool)) != PP_OK)
        return pp_error(st, "executor: no memory for worker %d's KV (%lld bytes): %s", rank,
                        (long long)pool_bytes, pp_error_detail());
    w->kv.pool = w->kv_pool;
    int64_t T = ex->max_rows, q_dim = (int64_t)s->n_heads * c->head_dim;
    int64_t kv_dim = (int64_t)s->n_kv_heads * c->head_dim;
    /* the head's logits pass through scratch when the worker writes only a slice of each row, or
     * when its backend's memory is not the caller's */
    int64_t head = m->has_head && (ex->n_workers > 1 || !be->host_memory)
                       ? (int64_t)PP_EXEC_HEAD_ROWS * s->n_vocab : 0;
    int64_t sizes[] = {T * c->dim, T * c->dim, T * q_dim, T * kv_dim, T * kv_dim, T * q_dim,
                       T * s->ffn_dim, T * s->ffn_dim, head, c->n_experts > 0 ? T * c->dim : 0};
    float **bufs[] = WORKER_BUFS(w);
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (sizes[i] > 0 && (st = be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS,
                                                     sizes[i] * (int64_t)sizeof(float),
                                                     (void **)bufs[i])) != PP_OK)
            return pp_error(st, "executor: no memory for worker %d's %lld-row scratch: %s", rank,
                            (long long)T, pp_error_detail());
    if (c->n_experts > 0 && (st = pp_moe_scratch_new(be, c, T, s->moe_ffn_rows, &w->moe)) != PP_OK)
        return st;
    int64_t max_cols = c->dim;
    if (q_dim > max_cols)
        max_cols = q_dim;
    if (s->ffn_dim > max_cols)
        max_cols = s->ffn_dim;
    if (s->moe_ffn_rows > max_cols)
        max_cols = s->moe_ffn_rows;
    return be->ops->reserve(be, max_cols, ex->max_context);
}

/* The workers' communicator: shared memory among CPU workers, NCCL among GPUs (one per worker). */
static pp_status comm_new(struct pp_backend *const *bes, int32_t n, struct pp_comm **out)
{
    int host = bes[0]->host_memory;
    for (int32_t r = 1; r < n; r++)
        if (bes[r]->host_memory != host)
            return pp_error(PP_ERR_INVALID_ARG, "executor: worker %d runs on %s but worker 0 on "
                            "%s: a stage's workers must share one kind of backend", r,
                            bes[r]->name, bes[0]->name);
    if (host)
        return pp_comm_cpu_new(n, out);
#ifdef PP_HAVE_NCCL
    int devices[64];
    for (int32_t r = 0; r < n; r++)
        devices[r] = bes[r]->device;
    return pp_comm_nccl_new(n, devices, out);
#elif defined(PP_HAVE_CUDA)
    return pp_error(PP_ERR_UNSUPPORTED, "executor: %d %s workers need NCCL, and this build has "
                    "none (configure with NCCL_ROOT pointing at an NCCL installation)", n,
                    bes[0]->name);
#else
    return pp_error(PP_ERR_UNSUPPORTED, "executor: %d %s workers need a device communicator, and "
                    "this build has none", n, bes[0]->name);
#endif
}

pp_status pp_executor_new(const struct pp_model *m, struct pp_backend *be,
                          const struct pp_executor_opts *opts, struct pp_executor **out)
{
    return pp_executor_new_workers(m, &be, 1, opts, out);
}

/* The KV dimension one worker of n_workers holds: its KV heads of every block. */
static int32_t worker_kv_dim(const struct pp_model_config *c, int32_t n_workers)
{
    int32_t kv_heads_each = n_workers <= c->n_kv_heads ? c->n_kv_heads / n_workers : 1;
    return kv_heads_each * c->head_dim;
}

/* opts with its defaults filled in for m on n_workers workers, the KV budget included. */
static struct pp_executor_opts with_defaults(const struct pp_model *m, int32_t n_workers,
                                             const struct pp_executor_opts *opts)
{
    const struct pp_model_config *c = &m->cfg;
    struct pp_executor_opts o = *opts;
    if (o.max_batch_tokens <= 0)
        o.max_batch_tokens = 256;
    if (o.kv_block_size <= 0)
        o.kv_block_size = 16;
    if (o.max_seqs <= 0)
        o.max_seqs = 64;
    if (o.max_context <= 0 || o.max_context > c->max_context)
        o.max_context = c->max_context;
    if (o.ep <= 0)
        o.ep = 1;
    if (o.kv_budget_bytes <= 0) {
        /* every worker holds its KV heads of every block: a block costs W times one worker's
         * share */
        int64_t block_bytes = pp_kv_block_bytes(m->last_layer - m->first_layer,
                                                worker_kv_dim(c, n_workers), o.kv_block_size);
        int64_t per_seq = (o.max_context + o.kv_block_size - 1) / o.kv_block_size;
        int64_t blocks = (int64_t)o.max_seqs * per_seq;
        o.kv_budget_bytes = blocks * block_bytes * n_workers;
        if (o.kv_budget_bytes > ((int64_t)1 << 30))
            o.kv_budget_bytes = (int64_t)1 << 30;
    }
    return o;
}

int64_t pp_executor_kv_budget(const struct pp_model *m, int32_t n_workers,
                              const struct pp_executor_opts *opts)
{
    return with_defaults(m, n_workers, opts).kv_budget_bytes;
}

pp_status pp_executor_new_workers(const struct pp_model *m, struct pp_backend *const *bes,
                                  int32_t n_workers, const struct pp_executor_opts *opts,
                                  struct pp_executor **out)
{
    const struct pp_model_config *c = &m->cfg;
    struct pp_executor_opts o = with_defaults(m, n_workers, opts);
    pp_status st = pp_shard_check(c, n_workers, o.ep, "model");
    if (st != PP_OK)
        return st;
    int32_t n_layers = m->last_layer - m->first_layer;
    int32_t kv_dim = worker_kv_dim(c, n_workers);
    struct pp_executor *ex = pp_calloc(PP_MEM_MISC, 1, sizeof(*ex));
    if (!ex)
        return PP_ERR_NOMEM;
    ex->m = m;
    ex->max_rows = o.max_batch_tokens;
    ex->max_context = o.max_context;
    ex->n_workers = n_workers;
    ex->ep = o.ep;
    int64_t T = ex->max_rows;
    if ((st = pp_kv_cache_new_tables(n_layers, kv_dim, o.kv_block_size,
                                     o.kv_budget_bytes / n_workers, o.max_seqs, o.max_context,
                                     &ex->kv)) != PP_OK ||
        !(ex->workers = pp_calloc(PP_MEM_MISC, (size_t)n_workers, sizeof(*ex->workers))) ||
        !(ex->pos = scratch(T, sizeof(int32_t))) ||
        !(ex->aseqs = scratch(T, sizeof(struct pp_attn_seq))) ||
        !(ex->want_rows = scratch(T, sizeof(int32_t))) ||
        (c->n_experts > 0 &&
         !(ex->expert_tokens = pp_calloc(PP_MEM_MISC, (size_t)n_layers * (size_t)c->n_experts,
                                         sizeof(int64_t))))) {
        pp_executor_free(ex);
        return st != PP_OK ? st : PP_ERR_NOMEM;
    }
    for (int32_t r = 0; r < n_workers; r++)
        if ((st = worker_init(ex, &ex->workers[r], r, bes[r])) != PP_OK) {
            pp_executor_free(ex);
            return st;
        }
    if (n_workers > 1 && ((st = comm_new(bes, n_workers, &ex->comm)) != PP_OK ||
                          (st = pp_threadpool_new(n_workers, &ex->pool)) != PP_OK)) {
        pp_executor_free(ex);
        return st;
    }
    *out = ex;
    return PP_OK;
}

void pp_executor_free(struct pp_executor *ex)
{
    if (!ex)
        return;
    pp_threadpool_free(ex->pool);
    pp_comm_free(ex->comm);
    if (ex->workers)
        for (int32_t r = 0; r < ex->n_workers; r++)
            worker_free(ex, &ex->workers[r]);
    pp_free(PP_MEM_MISC, ex->workers);
    pp_kv_cache_free(ex->kv);
    pp_free(PP_MEM_ACTIVATIONS, ex->pos);
    pp_free(PP_MEM_ACTIVATIONS, ex->aseqs);
    pp_free(PP_MEM_ACTIVATIONS, ex->want_rows);
    pp_free(PP_MEM_MISC, ex->expert_tokens);
    pp_free(PP_MEM_MISC, ex);
}

/* Checks the whole batch before anything changes. */
static pp_status validate(struct pp_executor *ex, const struct pp_exec_batch *b, int64_t *n_tokens)
{
    const struct pp_model *m = ex->m;
    if (b->n_seqs < 1 || !b->seqs)
        return pp_error(PP_ERR_INVALID_ARG, "batch: expected at least one sequence");
    if (m->has_embedding ? !b->tokens : !b->hidden)
        return pp_error(PP_ERR_INVALID_ARG, "batch: layer range [%d, %d) needs %s",
                        m->first_layer, m->last_layer,
                        m->has_embedding ? "token ids" : "hidden states");
    int64_t total = 0, blocks = 0, new_seqs = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const struct pp_exec_seq *s = &b->seqs[i];
        for (int32_t j = 0; j < i; j++)
            if (b->seqs[j].id == s->id)
                return pp_error(PP_ERR_INVALID_ARG, "batch: sequence %llu appears twice",
                                (unsigned long long)s->id);
        if (s->n_tokens < 1 || s->pos < 0)
            return pp_error(PP_ERR_INVALID_ARG,
                            "sequence %llu: expected pos >= 0 and n_tokens >= 1, got pos %d, "
                            "n_tokens %d", (unsigned long long)s->id, s->pos, s->n_tokens);
        if ((int64_t)s->pos + s->n_tokens > ex->max_context)
            return pp_error(PP_ERR_OUT_OF_RANGE,
                            "sequence %llu: positions up to %lld exceed the context length %d",
                            (unsigned long long)s->id, (long long)s->pos + s->n_tokens,
                            ex->max_context);
        struct pp_kv_seq *kv = pp_kv_cache_find(ex->kv, s->id);
        int32_t have = kv ? kv->len : 0;
        if (!kv && s->pos != 0)
            return pp_error(PP_ERR_NOT_FOUND, "sequence %llu is unknown here (pos %d given; a new "
                            "sequence starts at pos 0)", (unsigned long long)s->id, s->pos);
        if (kv && s->pos != have)
            return pp_error(PP_ERR_INVALID_ARG,
                            "sequence %llu: expected pos %d (tokens held), got %d",
                            (unsigned long long)s->id, have, s->pos);
        if (!kv) {
            new_seqs++;
            blocks += (s->n_tokens + ex->kv->view.block_size - 1) / ex->kv->view.block_size;
        } else {
            blocks += pp_kv_cache_blocks_needed(ex->kv, kv, s->pos + s->n_tokens);
        }
        total += s->n_tokens;
    }
    if (m->has_embedding)
        for (int64_t t = 0; t < total; t++)
            if (b->tokens[t] < 0 || b->tokens[t] >= m->cfg.vocab_size)
                return pp_error(PP_ERR_INVALID_ARG, "token id %d at batch row %lld is outside the "
                                "vocabulary [0, %d)", b->tokens[t], (long long)t,
                                m->cfg.vocab_size);
    if (new_seqs > ex->kv->max_seqs - pp_kv_cache_active_seqs(ex->kv))
        return pp_error(PP_ERR_EXHAUSTED, "batch starts %lld sequences, %d slots are free",
                        (long long)new_seqs, ex->kv->max_seqs - pp_kv_cache_active_seqs(ex->kv));
    if (blocks > pp_kv_cache_free_blocks(ex->kv))
        return pp_error(PP_ERR_EXHAUSTED, "batch needs %lld KV blocks, %d are free",
                        (long long)blocks, pp_kv_cache_free_blocks(ex->kv));
    *n_tokens = total;
    return PP_OK;
}

static void worker_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    struct pp_executor *ex = ctx;
    for (int64_t r = begin; r < end; r++)
        pp__exec_worker_run(ex, &ex->workers[r]);
}

/* Runs rows [r0, r0 + T) of the batch through every layer of the range on every worker. kvs holds
 * each batch sequence's KV entry. logit_index counts the logit rows written so far. */
static pp_status run_window(struct pp_executor *ex, const struct pp_exec_batch *b,
                            struct pp_kv_seq **kvs, int64_t r0, int64_t T, float *hidden_out,
                            float *logits_out, int64_t *logit_index)
{
    /* the parts of the batch's sequences that fall inside this window */
    int32_t n_parts = 0, n_want = 0;
    int64_t row = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const struct pp_exec_seq *s = &b->seqs[i];
        int64_t s0 = row, s1 = row + s->n_tokens;
        row = s1;
        int64_t a = s0 > r0 ? s0 : r0, z = s1 < r0 + T ? s1 : r0 + T;
        if (a >= z)
            continue;
        struct pp_attn_seq *p = &ex->aseqs[n_parts++];
        p->row = (int32_t)(a - r0);
        p->n_tokens = (int32_t)(z - a);
        p->pos = s->pos + (int32_t)(a - s0);
        p->block_table = kvs[i]->blocks;
        for (int32_t t = 0; t < p->n_tokens; t++)
            ex->pos[p->row + t] = p->pos + t;
        if (s->want_logits && z == s1)
            ex->want_rows[n_want++] = (int32_t)(z - 1 - r0);
    }
    ex->batch = b;
    ex->r0 = r0;
    ex->rows = T;
    ex->n_parts = n_parts;
    ex->n_want = n_want;
    ex->hidden_out = hidden_out;
    ex->logits_out = logits_out ? logits_out + *logit_index * ex->m->cfg.vocab_size : NULL;
    if (ex->n_workers == 1)
        pp__exec_worker_run(ex, &ex->workers[0]);
    else
        pp_threadpool_run(ex->pool, worker_task, ex, ex->n_workers, 1);
    *logit_index += n_want;
    for (int32_t r = 0; r < ex->n_workers; r++)
        if (ex->workers[r].status != PP_OK)
            return ex->workers[r].status;
    return PP_OK;
}

pp_status pp_executor_forward(struct pp_executor *ex, const struct pp_exec_batch *b,
                              float *hidden_out, float *logits_out)
{
    int64_t n_tokens = 0;
    pp_status st = validate(ex, b, &n_tokens);
    if (st != PP_OK)
        return st;
    if (ex->m->has_head ? !logits_out : !hidden_out)
        return pp_error(PP_ERR_INVALID_ARG, "executor: no output buffer for %s",
                        ex->m->has_head ? "logits" : "hidden states");
    struct pp_kv_seq *kvs_stack[64];
    struct pp_kv_seq **kvs = kvs_stack;
    if (b->n_seqs > 64 && !(kvs = pp_alloc(PP_MEM_MISC, (size_t)b->n_seqs * sizeof(*kvs))))
        return PP_ERR_NOMEM;
    /* validated above: creation and reservation cannot fail from here on */
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const struct pp_exec_seq *s = &b->seqs[i];
        kvs[i] = pp_kv_cache_find(ex->kv, s->id);
        if (!kvs[i])
            pp_kv_cache_create(ex->kv, s->id, &kvs[i]);
        pp_kv_cache_reserve(ex->kv, kvs[i], s->pos + s->n_tokens);
    }
    int64_t logit_index = 0;
    for (int64_t r0 = 0; r0 < n_tokens && st == PP_OK; r0 += ex->max_rows) {
        int64_t T = n_tokens - r0 < ex->max_rows ? n_tokens - r0 : ex->max_rows;
        st = run_window(ex, b, kvs, r0, T, hidden_out, logits_out, &logit_index);
    }
    for (int32_t i = 0; i < b->n_seqs; i++)
        kvs[i]->len = b->seqs[i].pos + b->seqs[i].n_tokens;
    if (kvs != kvs_stack)
        pp_free(PP_MEM_MISC, kvs);
    return st;
}

int pp_executor_release(struct pp_executor *ex, uint64_t id)
{
    return pp_kv_cache_release(ex->kv, id);
}

int32_t pp_executor_seq_len(struct pp_executor *ex, uint64_t id)
{
    struct pp_kv_seq *s = pp_kv_cache_find(ex->kv, id);
    return s ? s->len : -1;
}

const struct pp_kv_cache *pp_executor_kv(const struct pp_executor *ex)
{
    return ex->kv;
}

int32_t pp_executor_max_context(const struct pp_executor *ex)
{
    return ex->max_context;
}

const struct pp_model *pp_executor_model(const struct pp_executor *ex)
{
    return ex->m;
}

int32_t pp_executor_workers(const struct pp_executor *ex)
{
    return ex->n_workers;
}

int64_t pp_executor_bytes_reduced(const struct pp_executor *ex)
{
    return ex->comm ? __atomic_load_n(&ex->comm->bytes_reduced, __ATOMIC_RELAXED) : 0;
}

const int64_t *pp_executor_expert_tokens(const struct pp_executor *ex, int32_t layer)
{
    const struct pp_model *m = ex->m;
    if (!ex->expert_tokens || layer < 0 || layer >= m->last_layer - m->first_layer ||
        !m->layers[layer].moe)
        return NULL;
    return ex->expert_tokens + (int64_t)layer * m->cfg.n_experts;
}

void pp_executor_worker_experts(const struct pp_executor *ex, int32_t rank, int32_t *first,
                                int32_t *n)
{
    const struct pp_shard *s = ex->workers[rank].shard;
    *first = s->expert0;
    *n = s->n_experts;
}
