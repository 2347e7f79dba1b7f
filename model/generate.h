/* Generation of one sequence in one process: prefill the prompt through a full-range executor, then
 * decode token by token, sampling on the host, until max_tokens, an end-of-sequence token, a stop
 * string or the context end. What `ppserve run` does; the pipeline splits the same loop across
 * daemons. */
#ifndef PP_GENERATE_H
#define PP_GENERATE_H

#include <stdint.h>

#include "common/status.h"
#include "model/executor.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

enum pp_finish_reason { PP_FINISH_LENGTH = 0, PP_FINISH_STOP };

struct pp_gen_request {
    const int32_t *prompt; /* [n_prompt] token ids, used as given */
    int32_t n_prompt;
    int32_t max_tokens;
    struct pp_sampling sampling;
    const char *const *stops; /* [n_stops] stop strings (need a tokenizer) */
    int n_stops;
    int ignore_eos;           /* 1: an EOS token does not end generation */
    uint64_t seq_id;
};

struct pp_gen_callbacks {
    /* every generated token with the raw logits that produced it (before any sampling transform) */
    void (*on_token)(void *ud, int32_t id, const float *logits, int32_t vocab);
    /* text as it becomes safe to show */
    void (*on_text)(void *ud, const char *text, size_t n);
    void *ud;
};

struct pp_gen_result {
    int32_t *ids; /* [n_ids] generated tokens; pp_free(PP_MEM_MISC) */
    int32_t n_ids;
    char *text;   /* generated text (NUL-terminated) when a tokenizer is present, else NULL */
    size_t text_len;
    enum pp_finish_reason finish;
    double prefill_seconds;
    double decode_seconds;
};

/* tok may be NULL (no text, no stop strings). The executor must cover all layers. */
pp_status pp_generate(struct pp_executor *ex, const struct pp_tokenizer *tok,
                      const struct pp_gen_request *req, const struct pp_gen_callbacks *cb,
                      struct pp_gen_result *res);
void pp_gen_result_free(struct pp_gen_result *res);

const char *pp_finish_reason_name(enum pp_finish_reason r);

#endif
