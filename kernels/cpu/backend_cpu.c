/* The CPU backend: its op table, thread pool and per-thread scratch. */
#include <string.h>

#include "common/alloc.h"
#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/matmul_q8.h"

static void cpu_free(struct pp_backend *be)
{
    if (!be)
        return;
    struct pp_cpu *c = be->impl;
    if (c) {
        pp_threadpool_free(c->pool);
        for (int s = 0; s < PP_CPU_SCRATCH_COUNT; s++)
            pp_free(PP_MEM_ACTIVATIONS, c->scratch[s]);
        pp_free(PP_MEM_ACTIVATIONS, c->x_padded);
        pp_free(PP_MEM_MISC, c);
    }
    pp_free(PP_MEM_MISC, be);
}

static int x_padded_reserve(struct pp_cpu *c, int64_t n)
{
    if (n <= c->x_padded_cap)
        return 0;
    float *p = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)n * sizeof(float));
    if (!p)
        return -1;
    pp_free(PP_MEM_ACTIVATIONS, c->x_padded);
    c->x_padded = p;
    c->x_padded_cap = n;
    return 0;
}

static pp_status cpu_reserve(struct pp_backend *be, int64_t max_cols, int64_t max_context)
{
    struct pp_cpu *c = be->impl;
    if (max_cols < c->max_cols)
        max_cols = c->max_cols;
    if (max_context < c->max_context)
        max_context = c->max_context;
    if (pp__cpu_scratch_reserve(c, PP_CPU_SCRATCH_ROW, max_cols) != 0 ||
        pp__cpu_scratch_reserve(c, PP_CPU_SCRATCH_SCORES, pp__cpu_attn_scratch(max_cols)) != 0 ||
        pp__cpu_scratch_reserve(c, PP_CPU_SCRATCH_PARTS,
                                pp__cpu_attn_parts(max_cols, max_context)) != 0 ||
        pp__cpu_scratch_reserve(c, PP_CPU_SCRATCH_PANEL, PP_MM_PANEL_ROWS * PP_MM_KC) != 0 ||
        pp__cpu_scratch_reserve(c, PP_CPU_SCRATCH_ACC, PP_MM_ACC_CAP) != 0 ||
        pp__cpu_scratch_reserve(c, PP_CPU_SCRATCH_Q8_SPLIT,
                                (pp__q8_split_bytes(max_cols) + 3) / 4) != 0 ||
        x_padded_reserve(c, pp__cpu_x_padded_floats(max_cols)) != 0)
        return pp_error(PP_ERR_NOMEM,
                        "cpu backend: no memory for scratch (%lld cols, %lld positions)",
                        (long long)max_cols, (long long)max_context);
    c->max_cols = max_cols;
    c->max_context = max_context;
    return PP_OK;
}

static const struct pp_backend_ops cpu_ops = {
    .reserve = cpu_reserve,
    .buf_alloc = pp__cpu_buf_alloc,
    .buf_free = pp__cpu_buf_free,
    .copy_in = pp__cpu_copy,
    .zero = pp__cpu_zero,
    .copy = pp__cpu_copy,
    .copy_out = pp__cpu_copy_out,
    .sync = pp__cpu_sync,
    .weight_load = pp__cpu_weight_load,
    .weight_free = pp__cpu_weight_free,
    .vec_load = pp__cpu_vec_load,
    .vec_free = pp__cpu_vec_free,
    .matmul = pp__cpu_matmul,
    .matmul_many = pp__cpu_matmul_many,
    .rmsnorm = pp__cpu_rmsnorm,
    .rope = pp__cpu_rope,
    .kv_store = pp__cpu_kv_store,
    .attention = pp__cpu_attention,
    .swiglu = pp__cpu_swiglu,
    .add = pp__cpu_add,
    .add_bias = pp__cpu_add_bias,
    .add_gated = pp__cpu_add_gated,
    .embed = pp__cpu_embed,
    .gather_rows = pp__cpu_gather_rows,
    .scatter_add_rows = pp__cpu_scatter_add_rows,
    .moe_route = pp__cpu_moe_route,
    .topk = pp__cpu_topk,
    .free = cpu_free,
};

int pp__cpu_scratch_reserve(struct pp_cpu *c, enum pp_cpu_scratch_slot slot, int64_t n)
{
    if (n <= c->cap[slot])
        return 0;
    n = (n + 15) & ~(int64_t)15; /* keep each thread's slice 64-byte aligned */
    float *p = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(n * c->n_threads) * sizeof(float));
    if (!p)
        return -1;
    pp_free(PP_MEM_ACTIVATIONS, c->scratch[slot]);
    c->scratch[slot] = p;
    c->cap[slot] = n;
    return 0;
}

pp_status pp_backend_cpu_new(int n_threads, struct pp_backend **out)
{
    struct pp_backend *be = pp_calloc(PP_MEM_MISC, 1, sizeof(*be));
    struct pp_cpu *c = pp_calloc(PP_MEM_MISC, 1, sizeof(*c));
    if (!be || !c) {
        pp_free(PP_MEM_MISC, be);
        pp_free(PP_MEM_MISC, c);
        return PP_ERR_NOMEM;
    }
    be->ops = &cpu_ops;
    be->name = "cpu";
    be->device = -1;
    be->host_memory = 1;
    be->impl = c;
    pp_status st = pp_simd_check_env();
    if (st == PP_OK)
        st = pp_threadpool_new(n_threads, &c->pool);
    if (st != PP_OK) {
        cpu_free(be);
        return st;
    }
    c->n_threads = n_threads;
    c->simd = pp_simd_get();
    c->prefetch_l2 = pp_simd_prefetch_l2();
    c->amd_tiles = pp_simd_amd_tiles();
    c->q8_pairs = pp_simd_q8_pairs(c->simd);
    be->n_threads = n_threads;
    *out = be;
    return PP_OK;
}

void pp_backend_cpu_map_weights(struct pp_backend *be, int on)
{
    if (be && be->ops == &cpu_ops)
        ((struct pp_cpu *)be->impl)->map_weights = on != 0;
}

pp_status pp_backend_cpu_new_workers(int n_threads, int n_workers, struct pp_backend **out)
{
    if (n_workers < 1 || n_threads < 1)
        return pp_error(PP_ERR_INVALID_ARG, "cpu workers: expected >= 1 threads and workers, got "
                        "%d threads for %d workers", n_threads, n_workers);
    for (int r = 0; r < n_workers; r++)
        out[r] = NULL;
    for (int r = 0; r < n_workers; r++) {
        int t = n_threads / n_workers + (r < n_threads % n_workers ? 1 : 0);
        pp_status st = pp_backend_cpu_new(t > 0 ? t : 1, &out[r]);
        if (st != PP_OK) {
            pp_backend_free_all(out, n_workers);
            return st;
        }
    }
    return PP_OK;
}

void pp_backend_free_all(struct pp_backend **bes, int n)
{
    for (int r = 0; r < n; r++)
        if (bes[r]) {
            bes[r]->ops->free(bes[r]);
            bes[r] = NULL;
        }
}
