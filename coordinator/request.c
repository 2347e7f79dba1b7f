/* A client's request as the coordinator holds it, and the responses streamed back to the client. */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "coordinator/coordinator.h"

void co_request_free(struct co_request *req)
{
    if (!req)
        return;
    for (int i = 0; i < req->n_stops; i++)
        pp_free(PP_MEM_MISC, req->stops[i]);
    pp_free(PP_MEM_MISC, req->stops);
    pp_free(PP_MEM_MISC, req->tokens);
    pp_textstream_free(&req->ts);
    pp_free(PP_MEM_MISC, req);
}

void co_request_respond(struct coordinator *co, struct co_request *req, int from_gen,
                        const float *logits, int n_logits_rows, int final, int finish_stop)
{
    if (req->client_gone)
        return;
    Ppserve__V1__GenerateResponse out = PPSERVE__V1__GENERATE_RESPONSE__INIT;
    Ppserve__V1__Usage usage = PPSERVE__V1__USAGE__INIT;
    out.n_ids = (size_t)(req->n_gen - from_gen);
    out.ids = &req->tokens[req->n_prompt + from_gen];
    const char *text;
    size_t n_text = pp_textstream_take(&req->ts, final, &text);
    char *text_z = pp_alloc(PP_MEM_RPC, n_text + 1);
    if (!text_z) {
        pp_rpc_stream_finish(req->client, PP_ERR_NOMEM, "out of memory");
        return;
    }
    if (n_text)
        memcpy(text_z, text, n_text);
    text_z[n_text] = '\0';
    out.text = text_z;
    if (!req->sent_first) {
        out.n_prompt_ids = (size_t)req->n_prompt;
        out.prompt_ids = req->tokens;
        req->sent_first = 1;
    }
    if (logits && n_logits_rows > 0) {
        out.logits.data = (uint8_t *)logits;
        out.logits.len = (size_t)n_logits_rows * (size_t)co->mcfg.vocab_size * sizeof(float);
    }
    if (final) {
        out.finish_reason = finish_stop ? PPSERVE__V1__FINISH_REASON__FINISH_REASON_STOP
                                        : PPSERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH;
        usage.prompt_tokens = (uint32_t)req->n_prompt;
        usage.completion_tokens = (uint32_t)req->n_gen;
        double prefill = req->t_first_token - req->t_admit;
        double decode = req->t_last_token - req->t_first_token;
        usage.prefill_tokens_per_s = prefill > 0 && req->n_gen > 0 ? req->n_prompt / prefill : 0;
        usage.decode_tokens_per_s = decode > 0 && req->n_gen > 1 ? (req->n_gen - 1) / decode : 0;
        out.usage = &usage;
    }
    struct pp_buf b = {0};
    pp_status st = pp_rpc_pack(&out.base, &b);
    if (st == PP_OK)
        st = pp_rpc_stream_send(req->client, b.data, b.len);
    pp_buf_free(&b);
    pp_free(PP_MEM_RPC, text_z);
    if (final && st == PP_OK)
        pp_rpc_stream_finish(req->client, PP_OK, NULL);
    else if (st != PP_OK)
        PP_DEBUG("response to seq=%llu not sent: %s", (unsigned long long)req->seq_id,
                 pp_error_detail());
}
