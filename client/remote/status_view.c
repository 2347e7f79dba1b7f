/* A StatusResponse for people (a summary and one row per stage) and for scripts (one JSON object).
 * Shared by `ppserve status` and `ppserve cluster`. */
#include <inttypes.h>
#include <string.h>

#include "client/remote/remote.h"
#include "common/json_write.h"

static const char *str_or(const char *s, const char *fallback)
{
    return s && s[0] ? s : fallback;
}

char *pp_remote_human_bytes(uint64_t n, char *out, size_t cap)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    if (n < 1024) {
        snprintf(out, cap, "%" PRIu64 " B", n);
        return out;
    }
    double v = (double)n / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, cap, "%.1f %s", v, units[u]);
    return out;
}

/* MoE stages: per stage, the routing over its layers at a glance (the layer whose experts are the
 * least balanced, and its workers' balance); `--json` has every layer's counts. */
static void print_expert_load(FILE *f, const Ppserve__V1__StatusResponse *s)
{
    int header = 0;
    for (size_t i = 0; i < s->n_stages; i++) {
        const Ppserve__V1__StageStatus *g = s->stages[i];
        if (g->n_expert_load == 0)
            continue;
        if (!header)
            fprintf(f, "\n%-5s  %-10s  %-7s  %12s  %-17s  %-17s  %s\n", "stage", "moe layers",
                    "experts", "routed", "worst layer", "max/mean expert", "max/mean worker");
        header = 1;
        const Ppserve__V1__ExpertLoad *worst = g->expert_load[0];
        uint64_t routed = 0;
        for (size_t k = 0; k < g->n_expert_load; k++) {
            const Ppserve__V1__ExpertLoad *l = g->expert_load[k];
            for (size_t e = 0; e < l->n_tokens_per_expert; e++)
                routed += l->tokens_per_expert[e];
            if (l->max_over_mean_expert > worst->max_over_mean_expert)
                worst = l;
        }
        fprintf(f, "%-5u  %-10zu  %-7zu  %12" PRIu64 "  %-17d  %-17.2f  %.2f\n", g->index,
                g->n_expert_load, worst->n_tokens_per_expert, routed, worst->layer,
                worst->max_over_mean_expert, worst->max_over_mean_worker);
    }
}

void pp_remote_status_print(FILE *f, const Ppserve__V1__StatusResponse *s)
{
    fprintf(f, "model        %s\n", str_or(s->model, "-"));
    fprintf(f, "model_id     %s\n", str_or(s->model_id, "-"));
    fprintf(f, "state        %s%s\n", s->blocked ? "BLOCKED: " : "", str_or(s->state, "-"));
    fprintf(f, "requests     %u running, %u queued\n", s->requests_running, s->requests_queued);
    fprintf(f, "tokens/s     %.1f\n", s->tokens_per_s);
    if (s->idle)
        fprintf(f, "bubble       - (idle: no stage computed in the last window)\n");
    else
        fprintf(f, "bubble       %.1f%%\n", s->bubble_fraction * 100.0);
    fprintf(f, "in flight    %u microbatches\n", s->microbatches_in_flight);
    if (s->n_stages == 0) {
        fprintf(f, "stages       none\n");
        return;
    }
    /* the address column is as wide as the longest address */
    int aw = (int)strlen("address");
    for (size_t i = 0; i < s->n_stages; i++) {
        int n = (int)strlen(str_or(s->stages[i]->address, "-"));
        aw = n > aw ? n : aw;
    }
    /* tp/ep: the stage's workers and expert groups; "allreduce/tok": the bytes each worker adds
     * to all-reduces per token it computes (× tokens/s = the link's load; 0 with tp 1) */
    fprintf(f, "\n%-5s  %-*s  %-11s  %-5s  %-7s  %5s  %5s  %10s  %10s  %13s  %9s  %14s\n",
            "stage", aw, "address", "layers", "tp/ep", "healthy", "busy", "queue", "in", "out",
            "kv blocks", "tokens/s", "allreduce/tok");
    for (size_t i = 0; i < s->n_stages; i++) {
        const Ppserve__V1__StageStatus *g = s->stages[i];
        char layers[32], in[24], out[24], kv[32], busy[16], deg[24], red[24];
        snprintf(layers, sizeof(layers), "[%d,%d)", g->first_layer, g->last_layer);
        snprintf(kv, sizeof(kv), "%u/%u", g->kv_blocks_used, g->kv_blocks_total);
        snprintf(busy, sizeof(busy), "%.0f%%", g->busy_fraction * 100.0);
        snprintf(deg, sizeof(deg), "%u/%u", g->tp ? g->tp : 1, g->ep ? g->ep : 1);
        /* leaving: it stops once the pipeline's requests are done (at most leaving_in_s) */
        const char *health = !g->healthy ? "NO" : g->leaving ? "leaving" : "yes";
        fprintf(f, "%-5u  %-*s  %-11s  %-5s  %-7s  %5s  %5u  %10s  %10s  %13s  %9.1f  %14s\n",
                g->index, aw, str_or(g->address, "-"), layers, deg, health,
                busy, g->queue_depth, pp_remote_human_bytes(g->bytes_in, in, sizeof(in)),
                pp_remote_human_bytes(g->bytes_out, out, sizeof(out)), kv, g->tokens_per_s,
                pp_remote_human_bytes((uint64_t)(g->bytes_reduced_per_token + 0.5), red,
                                      sizeof(red)));
    }
    print_expert_load(f, s);
}

static void json_str(struct pp_json *j, const char *key, const char *v)
{
    pp_json_key(j, key);
    pp_json_cstring(j, v ? v : "");
}

static void json_int(struct pp_json *j, const char *key, int64_t v)
{
    pp_json_key(j, key);
    pp_json_int(j, v);
}

static void json_double(struct pp_json *j, const char *key, double v)
{
    pp_json_key(j, key);
    pp_json_double(j, v);
}

void pp_remote_status_print_json(FILE *f, const Ppserve__V1__StatusResponse *s)
{
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    json_str(&j, "model", s->model);
    json_str(&j, "model_id", s->model_id);
    json_str(&j, "state", s->state);
    json_int(&j, "requests_running", s->requests_running);
    json_int(&j, "requests_queued", s->requests_queued);
    json_double(&j, "tokens_per_s", s->tokens_per_s);
    json_double(&j, "bubble_fraction", s->bubble_fraction);
    pp_json_key(&j, "idle");
    pp_json_bool(&j, s->idle);
    json_int(&j, "microbatches_in_flight", s->microbatches_in_flight);
    pp_json_key(&j, "blocked");
    pp_json_bool(&j, s->blocked);
    pp_json_key(&j, "stages");
    pp_json_begin_array(&j);
    for (size_t i = 0; i < s->n_stages; i++) {
        const Ppserve__V1__StageStatus *g = s->stages[i];
        pp_json_begin_object(&j);
        json_int(&j, "index", g->index);
        json_str(&j, "address", g->address);
        json_int(&j, "first_layer", g->first_layer);
        json_int(&j, "last_layer", g->last_layer);
        pp_json_key(&j, "healthy");
        pp_json_bool(&j, g->healthy);
        pp_json_key(&j, "leaving");
        pp_json_bool(&j, g->leaving);
        json_double(&j, "leaving_in_s", g->leaving_in_s);
        json_double(&j, "busy_fraction", g->busy_fraction);
        json_int(&j, "queue_depth", g->queue_depth);
        /* uint64 counters: below 2^63 for any real run */
        json_int(&j, "bytes_in", (int64_t)g->bytes_in);
        json_int(&j, "bytes_out", (int64_t)g->bytes_out);
        json_int(&j, "kv_blocks_used", g->kv_blocks_used);
        json_int(&j, "kv_blocks_total", g->kv_blocks_total);
        json_double(&j, "tokens_per_s", g->tokens_per_s);
        json_int(&j, "tp", g->tp ? g->tp : 1);
        json_int(&j, "ep", g->ep ? g->ep : 1);
        json_int(&j, "bytes_reduced", (int64_t)g->bytes_reduced);
        json_double(&j, "bytes_reduced_per_token", g->bytes_reduced_per_token);
        pp_json_key(&j, "expert_load");
        pp_json_begin_array(&j);
        for (size_t k = 0; k < g->n_expert_load; k++) {
            const Ppserve__V1__ExpertLoad *l = g->expert_load[k];
            pp_json_begin_object(&j);
            json_int(&j, "layer", l->layer);
            pp_json_key(&j, "tokens_per_expert");
            pp_json_begin_array(&j);
            for (size_t e = 0; e < l->n_tokens_per_expert; e++)
                pp_json_int(&j, (int64_t)l->tokens_per_expert[e]);
            pp_json_end_array(&j);
            pp_json_key(&j, "tokens_per_worker");
            pp_json_begin_array(&j);
            for (size_t w = 0; w < l->n_tokens_per_worker; w++)
                pp_json_int(&j, (int64_t)l->tokens_per_worker[w]);
            pp_json_end_array(&j);
            json_double(&j, "max_over_mean_expert", l->max_over_mean_expert);
            json_double(&j, "max_over_mean_worker", l->max_over_mean_worker);
            pp_json_end_object(&j);
        }
        pp_json_end_array(&j);
        pp_json_end_object(&j);
    }
    pp_json_end_array(&j);
    pp_json_end_object(&j);
    fprintf(f, "%s\n", j.out.data && !j.out.failed ? j.out.data : "{}");
    pp_json_free(&j);
}
