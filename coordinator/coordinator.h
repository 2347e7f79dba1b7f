/* The coordinator daemon's state, shared by its files (internal to ppserve-coordinator).
 *
 * Threads and ownership: gRPC completion-queue threads run the handlers (registry.c, client_api.c,
 * deliver.c); the main thread sets the pipeline up (setup.c) and then ticks (timeouts, stage
 * liveness); the release thread (release.c) sends Release calls so that a slow stage never stalls
 * scheduling. Everything below `mu` is guarded by it. Scheduling (scheduler.c) runs inline with
 * mu held, from whichever thread changed something: a request arrived, results came back, a client
 * went away, a tick. */
#ifndef PP_COORDINATOR_H
#define PP_COORDINATOR_H

#include <pthread.h>
#include <stdint.h>

#include "common/rpc/health.h"
#include "common/rpc/rpc.h"
#include "coordinator/coordinator_config.h"
#include "model/model_config.h"
#include "model/textstream.h"
#include "model/tokenizer.h"
#include "ppserve/v1/client.pb-c.h"
#include "ppserve/v1/stage.pb-c.h"

#define CO_MAX_STAGES 64
#define CO_TRACE_KEEP 4096 /* microbatch timelines kept for Trace */
#define CO_BLOCKED_RETRY_S 30 /* a refused setup is retried this often (or when stages change) */

enum co_state {
    CO_WAITING,  /* for stages to register */
    CO_STARTING, /* assigning layers */
    CO_SERVING,
    CO_DOWN,     /* a stage died or a hop broke; requests fail with UNAVAILABLE */
    CO_STOPPING,
};

struct co_stage_sample {
    double at;      /* monotonic seconds when the heartbeat arrived */
    double busy, wall;
    uint64_t bytes_in, bytes_out, tokens, bytes_reduced;
};

struct co_stage {
    uint64_t id;
    char address[256];
    double weight_bps;     /* measured one-token matmul rate, with its tp workers */
    int64_t memory_bytes;  /* the whole stage's */
    int64_t worker_memory; /* one worker's: its smallest device (memory_bytes / tp without any) */
    int64_t kv_asked;      /* the KV it would hold at most (its kv_mb; 0: unknown) */
    int64_t kv_budget;     /* the KV the plan gives it (0: its own choice) */
    uint32_t threads;
    int32_t tp, ep;        /* its TP degree and expert groups (>= 1) */
    double last_seen;      /* monotonic seconds of the last heartbeat or registration */
    int alive;
    double leave_by;       /* leaving (leave.c): the pipeline ends by then (monotonic); 0: not */
    char leave_reason[64]; /* why it leaves, as it said ("SIGTERM") */
    /* assignment */
    int32_t first, last;   /* [first, last) */
    uint32_t kv_blocks, kv_block_tokens, max_seqs;
    int32_t max_context;
    uint64_t assigned_instance; /* the stage process that answered the Assign (0: unknown) */
    struct pp_rpc_channel *ch;
    /* the latest heartbeats: stats now, and a window's start for rates */
    Ppserve__V1__StageStats stats;
    struct co_stage_sample now, then;
    /* MoE: the latest heartbeat's expert load (only expert_load set, ratios filled); owned,
     * freed with co_stage_forget_experts */
    Ppserve__V1__StageStats *experts;
};

enum co_req_state { CO_REQ_QUEUED, CO_REQ_RUNNING, CO_REQ_DONE };

struct co_request {
    struct co_request *prev, *next; /* in co->queued or co->running */
    uint64_t seq_id;
    struct pp_rpc_stream *client;   /* the Generate stream; one reference held */
    enum co_req_state state;
    int client_gone;                /* on_end arrived: no more sends */
    int released;                   /* Release was queued for the stages */
    int kv_reserved;                /* kv_blocks count in co->kv_blocks_reserved */
    /* what was asked */
    int32_t *tokens;                /* [n_prompt + max_tokens]: prompt, then generated ids */
    int32_t n_prompt;
    int32_t max_tokens;             /* effective: capped by the context */
    Ppserve__V1__Sampling sampling;
    char **stops;
    int n_stops;
    int ignore_eos;
    int return_logits;
    /* progress */
    int32_t n_gen;                  /* generated tokens, tokens[n_prompt ..] */
    int32_t n_fed;                  /* tokens sent into the pipeline */
    int in_flight;                  /* microbatches in flight that carry this sequence */
    int sent_first;                 /* the first response (with prompt_ids) went out */
    int32_t kv_blocks;              /* reserved on every stage */
    struct pp_textstream ts;
    double t_arrival, t_admit, t_first_token, t_last_token, deadline;
};

struct co_mb_part {
    struct co_request *req;
    int want_logits;
};

struct co_microbatch {
    uint64_t id;
    int n_parts;
    struct co_mb_part *parts;
    int32_t n_tokens;
    int has_decode; /* carries decode steps */
    double sent;    /* realtime seconds */
};

struct co_release {
    uint64_t seq_id;
    int32_t kv_blocks;     /* reserved for it until the stages confirm */
    uint64_t pipeline_gen; /* the pipeline it was reserved in */
};

struct co_trace_entry {
    uint64_t id;
    uint32_t n_seqs, n_tokens;
    double sent, delivered;
    int n_spans;
    Ppserve__V1__StageSpan spans[CO_MAX_STAGES];
};

struct coordinator {
    struct pp_coordinator_config cfg; /* immutable after start */
    char model_path[4096];
    char model_id[64];
    struct pp_model_config mcfg;
    struct pp_tokenizer *tok;        /* NULL: the model has no tokenizer (ids only) */
    int64_t layer_bytes, first_bytes, last_bytes;
    struct pp_rpc_server *server;
    struct pp_rpc_health *health;
    int port;

    pthread_mutex_t mu;
    pthread_cond_t cond;             /* registration, state changes, the release queue */
    enum co_state state;
    char state_reason[1024];
    char last_failure[640];          /* why the last pipeline went down or was not formed; cleared
                                      * when one serves: Status keeps saying it while re-forming */
    int blocked;                     /* the last setup was refused: wait for the stages to change */
    uint64_t stages_gen;             /* bumped when a stage registers (again) or is dropped */
    double last_check;               /* monotonic seconds of the last co_check_stages */
    int stop;                        /* the release thread ends */
    int draining;                    /* SIGTERM: new requests are refused */
    volatile int *interrupted;       /* set by the signal handler */
    struct pp_rpc_channel
        *retired[4 * CO_MAX_STAGES]; /* channels of dropped stages, freed at exit */
    int n_retired;
    /* stages, in pipeline order once assigned */
    struct co_stage stages[CO_MAX_STAGES];
    int n_stages;
    uint64_t next_stage_id;
    /* data plane */
    struct pp_rpc_channel *first_ch; /* to stage 0 */
    struct pp_rpc_stream *first_hop; /* Forward stream to stage 0 */
    struct pp_rpc_stream *deliver;   /* the last stage's Deliver stream (server side) */
    /* requests */
    struct co_request queued;        /* list heads (sentinels) */
    struct co_request running;
    int n_queued, n_running;
    uint64_t next_seq_id;
    int32_t kv_blocks_reserved;
    int32_t kv_blocks_cap;           /* min over stages */
    int32_t kv_block_tokens;
    int32_t max_seqs;
    int32_t max_context;
    uint64_t pipeline_gen;           /* bumped each time a pipeline starts serving */
    /* microbatches in flight */
    struct co_microbatch *in_flight; /* [n_in_flight] */
    int n_in_flight;
    int max_in_flight;
    uint64_t next_mb_id;
    uint64_t rr_cursor;              /* round-robin start (a seq id) */
    /* releases for the stages: a sequence's KV stays reserved until every stage has freed it */
    struct co_release *release_q;
    int n_release, cap_release;
    pthread_t release_thread;
    /* accounting */
    uint64_t tokens_generated;
    double rate_t0;                  /* window start (monotonic) for tokens_per_s */
    uint64_t rate_tokens0;
    double tokens_per_s;
    struct co_trace_entry *trace;    /* ring of CO_TRACE_KEEP */
    uint64_t n_trace;
};

double co_now(void);      /* monotonic seconds */
double co_wall_now(void); /* realtime seconds (timestamps shared with the stages) */

/* registry.c: RegisterStage and Heartbeat; co_check_stages marks silent stages dead. */
pp_status co_registry_add(struct coordinator *co);
void co_check_stages(struct coordinator *co);
/* Forgets stage i (with mu held); its channel is kept until exit. */
void co_stage_drop(struct coordinator *co, int i);

/* leave.c: a stopping stage's Leave calls, and the drain they start: no new requests, the
 * accepted ones finish, then the pipeline goes down and the stage is dropped. */
pp_status co_leave_add(struct coordinator *co);
/* With mu held, from the tick: ends the drain once its requests are done or its time is over. */
void co_check_leaving(struct coordinator *co);
/* With mu held: the index of the stage the serving pipeline drains for (the first to go), or -1. */
int co_leaving(const struct coordinator *co);

/* ---- expert_load.c ---- */
/* Keeps a checked copy of a heartbeat's expert load (replacing the previous one); co->mu held. */
void co_stage_take_experts(struct co_stage *s, const Ppserve__V1__StageStats *in);
void co_stage_forget_experts(struct co_stage *s);

/* setup.c: plan, assign, open the data plane; returns when serving or failed. A failure that
 * retrying cannot mend (a stage refused its assignment, no partition fits) sets co->blocked. */
pp_status co_setup_pipeline(struct coordinator *co);
/* After a blocked setup (mu NOT held): returns when a stage registers or is dropped, a stage goes
 * silent, timeout_s passes, or the coordinator is interrupted. */
void co_setup_wait_change(struct coordinator *co, double timeout_s);

/* client_api.c: Generate, Tokenize, Status, Trace. */
pp_status co_client_api_add(struct coordinator *co);

/* deliver.c: the last stage's results. */
pp_status co_deliver_add(struct coordinator *co);

/* scheduler.c, with mu held. */
void co_schedule(struct coordinator *co);
void co_handle_results(struct coordinator *co, const Ppserve__V1__Results *r);
void co_request_enqueue(struct coordinator *co, struct co_request *req);
void co_request_client_gone(struct coordinator *co, struct co_request *req);
void co_fail_all(struct coordinator *co, pp_status st, const char *why);
void co_check_deadlines(struct coordinator *co);
/* Marks the pipeline down (once) and fails everything in it. */
void co_pipeline_down(struct coordinator *co, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The same for an orderly end (a stage left after its drain): logged as info, not error. */
void co_pipeline_retire(struct coordinator *co, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* request.c */
void co_request_free(struct co_request *req);
/* Sends what the request has produced since the last response; final adds finish and usage. */
void co_request_respond(struct coordinator *co, struct co_request *req, int from_gen,
                        const float *logits, int n_logits_rows, int final, int finish_stop);

/* release.c */
pp_status co_release_start(struct coordinator *co);
void co_release_stop(struct coordinator *co);
/* With mu held: frees seq_id on every stage, then returns its KV blocks to admission. */
void co_release_queue(struct coordinator *co, uint64_t seq_id, int32_t kv_blocks);

/* trace.c */
void co_trace_record(struct coordinator *co, const struct co_microbatch *mb,
                     const Ppserve__V1__Results *r);

#endif
