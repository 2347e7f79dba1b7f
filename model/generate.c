/* The single-process generation loop. */
#include "model/generate.h"

#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "model/textstream.h"

const char *pp_finish_reason_name(enum pp_finish_reason r)
{
    return r == PP_FINISH_STOP ? "stop" : "length";
}

void pp_gen_result_free(struct pp_gen_result *res)
{
    pp_free(PP_MEM_MISC, res->ids);
    pp_free(PP_MEM_MISC, res->text);
    memset(res, 0, sizeof(*res));
}

struct gen {
    struct pp_executor *ex;
    const struct pp_tokenizer *tok;
    const struct pp_gen_request *req;
    const struct pp_gen_callbacks *cb;
    struct pp_sampler *sampler;
    struct pp_textstream ts;
    float *logits;   /* [vocab] */
    int32_t *history; /* [n_prompt + max_tokens] */
    int32_t n_hist;
    int32_t vocab;
    const struct pp_model_config *cfg; /* its end-of-sequence set ends generation */
};

static void emit_text(struct gen *g, int final)
{
    const char *s;
    size_t n = pp_textstream_take(&g->ts, final, &s);
    if (n > 0 && g->cb && g->cb->on_text)
        g->cb->on_text(g->cb->ud, s, n);
}

/* Handles one generated token; returns 1 when generation must end. */
static int accept_token(struct gen *g, int32_t id, struct pp_gen_result *res)
{
    g->history[g->n_hist++] = id;
    res->ids[res->n_ids++] = id;
    if (g->tok) {
        char piece[1024];
        int n = pp_tokenizer_piece(g->tok, id, piece, sizeof(piece));
        if (n > (int)sizeof(piece))
            n = (int)sizeof(piece);
        if (n > 0 && pp_textstream_push(&g->ts, piece, (size_t)n) == 1) {
            res->finish = PP_FINISH_STOP;
            return 1;
        }
        emit_text(g, 0);
    }
    if (!g->req->ignore_eos && pp_model_config_is_eos(g->cfg, id)) {
        res->finish = PP_FINISH_STOP;
        return 1;
    }
    return 0;
}

static void sample_step(struct gen *g, struct pp_gen_result *res, int *done)
{
    float *raw = g->logits + g->vocab; /* the logits before the sampler transforms them */
    memcpy(raw, g->logits, (size_t)g->vocab * sizeof(float));
    int32_t id = pp_sample(g->sampler, &g->req->sampling, g->logits, g->history, g->n_hist,
                           (uint64_t)res->n_ids);
    if (g->cb && g->cb->on_token)
        g->cb->on_token(g->cb->ud, id, raw, g->vocab);
    *done = accept_token(g, id, res);
}

static pp_status run(struct gen *g, struct pp_gen_result *res)
{
    const struct pp_gen_request *req = g->req;
    int32_t ctx = pp_executor_max_context(g->ex);
    struct pp_exec_seq part = {req->seq_id, 0, req->n_prompt, 1};
    struct pp_exec_batch b = {1, &part, req->prompt, NULL};
    double t0 = pp_clock_mono();
    pp_status st = pp_executor_forward(g->ex, &b, NULL, g->logits);
    if (st != PP_OK)
        return st;
    res->prefill_seconds = pp_clock_mono() - t0;
    if (req->max_tokens == 0)
        return PP_OK;
    int done;
    sample_step(g, res, &done);
    double t1 = pp_clock_mono();
    while (!done && res->n_ids < req->max_tokens && req->n_prompt + res->n_ids < ctx) {
        part.pos = req->n_prompt + res->n_ids - 1;
        part.n_tokens = 1;
        b.tokens = &res->ids[res->n_ids - 1];
        if ((st = pp_executor_forward(g->ex, &b, NULL, g->logits)) != PP_OK)
            return st;
        sample_step(g, res, &done);
    }
    res->decode_seconds = pp_clock_mono() - t1;
    return PP_OK;
}

pp_status pp_generate(struct pp_executor *ex, const struct pp_tokenizer *tok,
                      const struct pp_gen_request *req, const struct pp_gen_callbacks *cb,
                      struct pp_gen_result *res)
{
    memset(res, 0, sizeof(*res));
    int32_t ctx = pp_executor_max_context(ex);
    if (req->n_prompt < 1)
        return pp_error(PP_ERR_INVALID_ARG, "prompt: expected at least one token, got none");
    if (req->n_prompt >= ctx)
        return pp_error(PP_ERR_OUT_OF_RANGE,
                        "prompt of %d tokens does not fit the context of %d tokens (it must leave "
                        "room for at least one generated token)", req->n_prompt, ctx);
    if (req->max_tokens < 0)
        return pp_error(PP_ERR_INVALID_ARG, "max_tokens: expected >= 0, got %d", req->max_tokens);
    if (req->n_stops > 0 && !tok)
        return pp_error(PP_ERR_INVALID_ARG,
                        "stop strings need a tokenizer, and this model has none");
    pp_status st = pp_sampling_validate(&req->sampling);
    if (st != PP_OK)
        return st;

    struct gen g = {.ex = ex, .tok = tok, .req = req, .cb = cb};
    const struct pp_model_config *mc = &pp_executor_model(ex)->cfg;
    g.vocab = mc->vocab_size;
    g.cfg = mc;
    int32_t max_new = req->max_tokens < ctx - req->n_prompt ? req->max_tokens : ctx - req->n_prompt;
    g.logits = pp_alloc(PP_MEM_ACTIVATIONS, (size_t)g.vocab * 2 * sizeof(float));
    g.history = pp_alloc(PP_MEM_MISC, (size_t)(req->n_prompt + max_new + 1) * sizeof(int32_t));
    res->ids = pp_alloc(PP_MEM_MISC, (size_t)(max_new + 1) * sizeof(int32_t));
    st = (g.logits && g.history && res->ids) ? pp_sampler_new(g.vocab, &g.sampler) : PP_ERR_NOMEM;
    if (st == PP_OK) {
        memcpy(g.history, req->prompt, (size_t)req->n_prompt * sizeof(int32_t));
        g.n_hist = req->n_prompt;
        pp_textstream_init(&g.ts, req->stops, req->n_stops);
        st = run(&g, res);
        emit_text(&g, 1);
        if (tok && st == PP_OK) {
            res->text = pp_alloc(PP_MEM_MISC, g.ts.text.len + 1);
            if (res->text && !g.ts.text.failed) {
                if (g.ts.text.len)
                    memcpy(res->text, g.ts.text.data, g.ts.text.len);
                res->text[g.ts.text.len] = '\0';
                res->text_len = g.ts.text.len;
            } else {
                st = PP_ERR_NOMEM;
            }
        }
        pp_textstream_free(&g.ts);
    }
    pp_executor_release(ex, req->seq_id);
    pp_sampler_free(g.sampler);
    pp_free(PP_MEM_ACTIVATIONS, g.logits);
    pp_free(PP_MEM_MISC, g.history);
    if (st != PP_OK)
        pp_gen_result_free(res);
    return st;
}
