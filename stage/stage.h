/* The stage daemon's shared context: one struct pp_stage per process, passed as the first argument
 * everywhere, and the parts its files share (recv, queue, compute, send, sample, assign, register,
 * probe). The only global is the immutable configuration inside the context.
 *
 * Threads and what they own:
 *   - main: start-up and shutdown (main.c); waits for SIGTERM/SIGINT with sigwait.
 *   - rpc server threads (2): Assign/Release handlers and the inbound Forward streams' callbacks
 *     (recv.c), which reassemble microbatches and push them on the queue.
 *   - rpc client thread (common/rpc): callbacks of the outgoing hop (send.c).
 *   - "compute" (compute.c): pops the queue, drives the executor, sends acks and the next hop.
 *   - "control" (register.c): RegisterStage, then Heartbeat every heartbeat_ms; once the stage
 *     stops, Leave calls until the coordinator lets it go (leave.c).
 *
 * Locks, in the order they may nest (never the other way):
 *   assign_mu → mu → info_mu / q_mu / stats_mu (leaves; q_mu may call into a stream's own lock).
 *   - assign_mu: one Assign at a time.
 *   - mu: the executor and everything in *asg (not thread-safe); the compute thread holds it while
 *     it computes and packs a microbatch (not while it sends), Assign to swap the assignment,
 *     Release to free sequences.
 *   - info_mu: info, what an inbound stream checks its handshake against (never held long).
 *   - q_mu: the microbatch queue and the list of inbound streams with their counters.
 *   - stats_mu: counters for the heartbeat and hop_error. */
#ifndef PP_STAGE_H
#define PP_STAGE_H

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/limits.h"
#include "common/rpc/health.h"
#include "common/rpc/hop.h"
#include "common/rpc/rpc.h"
#include "kernels/devices.h"
#include "model/executor.h"
#include "model/identity.h"
#include "model/sampler.h"
#include "ppserve/v1/stage.pb-c.h"
#include "stage/stage_config.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

#define PP_STAGE_PROTOCOL PPSERVE__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT
#define PP_STAGE_MAX_SEQS 256
#define PP_STAGE_MAX_WORKERS 64 /* the tp key's limit */
#define PP_STAGE_SLACK_BYTES (64 << 10) /* inbound limit above max_batch_tokens × dim × 4 */

struct pp_stage;
struct pp_stage_history;

/* One inbound Forward stream (the previous hop, or a test talking to the stage directly). */
struct pp_stage_inbound {
    struct pp_stage *s;
    struct pp_rpc_stream *st;                   /* the application's reference, released at free */
    struct pp_stage_inbound *prev, *next;       /* s->inbound list; q_mu */
    /* the stream's callbacks own these (they run one at a time) */
    struct pp_hop_assembler assembler;
    int handshaken;
    uint64_t gen;       /* the assignment it handshook with */
    int first_stage;    /* expects token ids rather than activations */
    int64_t dim;
    double recv_start;  /* first chunk of the microbatch being assembled (realtime seconds) */
    _Atomic int finished; /* this side ended the call: later messages are ignored */
    /* q_mu */
    int refs;        /* 1 until on_end, plus one per microbatch queued or computing */
    int pending;     /* microbatches queued or computing */
    int paused;      /* reading stopped because the queue was full */
    int half_closed; /* the sender is done: finish OK once pending reaches 0 */
    int ended;       /* on_end was delivered */
};

/* One reassembled microbatch on its way through the queue. */
struct pp_stage_mb {
    struct pp_stage_mb *next;
    Ppserve__V1__MicrobatchHeader *hdr; /* owned */
    struct pp_buf payload;              /* owned: int32 [n] or f32 [n, dim] */
    struct pp_stage_inbound *in;        /* holds a reference; acks go back on it */
    uint64_t gen;                       /* the assignment it arrived under */
    double recv_start, recv_end;        /* realtime seconds */
};

/* The outgoing hop: Stage/Forward to the next stage, or Coordinator/Deliver on the last one. */
struct pp_stage_out {
    struct pp_stage *s;
    char target[PP_CFG_STR_MAX];
    int deliver;              /* 1: Coordinator/Deliver with Results; 0: Stage/Forward */
    size_t max_queued;        /* messages queued before a send waits (backpressure) */
    struct pp_rpc_channel *ch;
    struct pp_rpc_stream *st;
    pthread_mutex_t mu;       /* guards the fields below */
    pthread_cond_t cv;
    int refs;                 /* the assignment's, plus the compute thread's while it sends */
    int ended;                /* on_end arrived */
    int closing;              /* this side is closing it: an end is not a failure */
    int broken;               /* it ended while in use */
    char why[768];            /* "next hop ADDR: <detail>" when broken */
    uint64_t acks, ack_errors;
};

/* One assignment: the model range, its executor and the outgoing hop. Owned by the context under
 * mu; built and freed by assign.c. */
struct pp_stage_assignment {
    uint64_t gen;
    uint64_t stage_id;               /* the coordinator's name for this stage (in Results) */
    uint32_t index;
    uint32_t n_stages;
    char model_name[PP_CFG_STR_MAX];
    char path[PATH_MAX];
    char model_id[PP_MODEL_ID_LEN];
    int32_t first_layer, last_layer; /* [first_layer, last_layer) */
    int32_t n_layers;
    int first, last;                 /* embeds token ids / samples tokens */
    int32_t dim, vocab;
    int32_t max_batch_tokens;
    uint64_t max_bytes;              /* an inbound microbatch's payload limit */
    struct pp_model *model;
    int32_t n_workers;                            /* the stage's tp */
    struct pp_backend *bes[PP_STAGE_MAX_WORKERS]; /* [n_workers] one CPU backend per worker */
    struct pp_executor *ex;
    int64_t reduced_seen;            /* pp_executor_bytes_reduced already added to the stats */
    struct pp_stage_out *out;
    struct pp_sampler *sampler;          /* last stage */
    struct pp_stage_history *history;    /* last stage: token ids per sequence */
    /* compute thread scratch, grown on demand */
    struct pp_exec_seq *seqs;  /* [seqs_cap] */
    size_t seqs_cap;
    float *hidden;             /* [rows, dim]: output of a first or middle stage */
    size_t hidden_cap;         /* floats */
    float *logits;             /* [parts with want_logits, vocab] */
    size_t logits_cap;         /* floats */
};

/* What an inbound stream checks its handshake and microbatches against (info_mu). */
struct pp_stage_info {
    int assigned;
    uint64_t gen;
    char model_id[PP_MODEL_ID_LEN];
    int32_t first_layer;
    int64_t dim;
    uint64_t max_bytes;
};

struct pp_stage {
    struct pp_stage_config cfg; /* immutable after start-up */
    char advertise[PP_CFG_STR_MAX + 16]; /* host:port as registered */
    uint64_t instance; /* random, this process's number in its registrations and AssignResponses */
    int32_t tp, ep;                 /* the degrees it runs with (pp_stage_config_degrees) */
    struct pp_device_spec devices;  /* the key `devices` resolved on this host: cpu or tp GPUs */
    char devices_used[16 * PP_DEVICES_MAX]; /* devices as text ("cpu", "cuda:0,1") */
    double weight_bytes_per_second; /* from the probe, with tp workers */
    /* what it may use of the host's memory; usable is at most memory_mb, and then limit_file
     * names that key (resolve_limits in stage/main.c) */
    struct pp_memory memory;
    double serving_since;           /* monotonic seconds */
    struct pp_rpc_server *server;
    struct pp_rpc_health *health;

    pthread_mutex_t assign_mu;
    pthread_mutex_t mu;
    struct pp_stage_assignment *asg; /* mu; NULL while unassigned */
    uint64_t next_gen;               /* assign_mu */

    pthread_mutex_t info_mu;
    struct pp_stage_info info;

    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;    /* an item arrived, or stop */
    pthread_cond_t idle_cv; /* an item was done */
    struct pp_stage_mb *q_head, *q_tail;
    int q_len;
    int busy;               /* the compute thread holds a popped item */
    int q_stop;
    struct pp_stage_inbound *inbound; /* every live inbound stream */
    pthread_t compute_thread;
    int compute_started;

    _Atomic int draining; /* shutting down: no new microbatches */
    _Atomic int abandon;  /* the grace period is over: stop waiting on the outgoing hop */

    pthread_t control_thread;
    int control_started;
    pthread_mutex_t ctl_mu;
    pthread_cond_t ctl_cv;
    int ctl_stop;
    uint64_t stage_id; /* control thread */
    /* leaving (leave.c): set by main, under ctl_mu; leaving is also read without it (Assign) */
    _Atomic int leaving;
    double leave_deadline; /* ctl_mu: monotonic seconds by which the stage stops */
    char leave_reason[16]; /* ctl_mu: "SIGTERM" or "SIGINT" */
    int left;              /* ctl_mu: the control thread is done with the coordinator */

    pthread_mutex_t stats_mu;
    double busy_seconds;
    uint64_t bytes_in, bytes_out, tokens;
    uint64_t bytes_reduced; /* per worker, over every assignment */
    uint32_t kv_used, kv_total;
    struct pp_stage_expert_load *experts; /* MoE assignments: the latest expert counts */
    char hop_error[768];
};

/* ---- clock.c ---- */
void pp_stage_sleep_us(long us);
/* A condition variable timed on the monotonic clock, and a wait on it until deadline (monotonic
 * seconds); returns 0 once the deadline has passed, 1 after a wake-up (spurious ones included). */
void pp_stage_cond_init(pthread_cond_t *cv);
int pp_stage_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline);

/* ---- error.c ---- */
/* st with "<fmt ...>: <the current detail>" as its detail. */
pp_status pp_stage_error_wrap(pp_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- probe.c ---- */
/* Times a one-token matmul over a synthetic 64 MiB f16 weight as the stage will run it: `workers`
 * CPU backends sharing `threads` threads (pp_backend_cpu_new_workers), each computing its slice of
 * the weight's rows on its own thread, all at once (best of 5 after a warm-up); *bytes_per_second
 * = weight bytes / seconds until the last worker is done. The weight has fewer rows where it and
 * its copy would take more than a quarter of memory (the bytes the stage may use; 0: unknown). */
pp_status pp_stage_probe(const struct pp_device_spec *devices, int threads, int workers,
                         uint64_t memory, double *bytes_per_second);

/* ---- register.c: the control thread ---- */
pp_status pp_stage_control_start(struct pp_stage *s);
/* Stops it; returns within one call deadline (2 s). */
void pp_stage_control_stop(struct pp_stage *s);

/* The control thread's wait: ms, or less once it must stop, or (wake_on_leave) once the stage
 * leaves; returns 0 once it must stop or (wake_on_leave) leave. */
int pp_stage_ctl_sleep(struct pp_stage *s, int64_t ms, int wake_on_leave);

/* ---- leave.c: the orderly exit ---- */
/* "SIGTERM" or "SIGINT": the signals that stop a stage. */
const char *pp_stage_signal_name(int sig);
/* Main thread, on SIGTERM/SIGINT while the control thread runs: asks it to leave (reason: the
 * signal's name) and waits until the coordinator lets the stage go, the coordinator cannot be
 * reached, deadline (monotonic seconds) passes, or another of sigs arrives. Meanwhile the stage
 * goes on computing the pipeline's microbatches. */
void pp_stage_leave(struct pp_stage *s, double deadline, const char *reason,
                    const sigset_t *sigs);
/* Control thread, registered and told to leave: calls Leave until the answer is done or a call
 * fails (or the thread must stop). */
void pp_stage_leave_loop(struct pp_stage *s, struct pp_rpc_channel *ch);

/* ---- assign.c ---- */
pp_status pp_stage_assign_handler(void *ud, const ProtobufCMessage *req, struct pp_buf *resp);
pp_status pp_stage_release_handler(void *ud, const ProtobufCMessage *req, struct pp_buf *resp);
/* Drops the current assignment (shutdown): closes its hop within timeout_ms, frees everything. */
void pp_stage_unassign(struct pp_stage *s, int timeout_ms);
/* Refreshes the KV counters and the expert load of the heartbeat from the current assignment; mu
 * held. */
void pp_stage_update_stats(struct pp_stage *s);

/* ---- expert_load.c: the MoE expert load in heartbeats ---- */
/* A copy of the assignment's per-layer expert token counts (pp_executor_expert_tokens) and its
 * workers' expert ranges, refreshed by pp_stage_update_stats. */
struct pp_stage_expert_load {
    int32_t first, last;   /* the assignment's layer range */
    int32_t n_layers;      /* MoE layers of the assignment */
    int32_t n_experts;
    int32_t n_workers;
    int32_t *layer;        /* [n_layers] absolute layer index */
    int64_t *tokens;       /* [n_layers, n_experts] tokens routed since the assignment */
    int32_t *worker_first; /* [n_workers] each worker's first expert */
    int32_t *worker_n;     /* [n_workers] and its expert count */
};

/* ExpertLoad messages built for one heartbeat; freed with pp_stage_expert_msgs_free. */
struct pp_stage_expert_msgs {
    Ppserve__V1__ExpertLoad *items;
    Ppserve__V1__ExpertLoad **ptrs;
    uint64_t *values; /* every entry's tokens_per_expert and tokens_per_worker */
    size_t n;
};

/* Copies the counts of s->asg (or forgets them without an MoE assignment); mu held, takes
 * stats_mu. */
void pp_stage_expert_load_update(struct pp_stage *s);
/* Fills st->expert_load from the latest copy; stats_mu held. On no memory it reports none. */
void pp_stage_expert_load_fill(struct pp_stage *s, Ppserve__V1__StageStats *st,
                               struct pp_stage_expert_msgs *m);
void pp_stage_expert_msgs_free(struct pp_stage_expert_msgs *m);
void pp_stage_expert_load_free(struct pp_stage_expert_load *l); /* NULL-safe */

/* ---- recv.c: inbound Forward streams ---- */
extern const struct pp_rpc_stream_cbs pp_stage_forward_cbs;
void *pp_stage_forward_open(void *ud, struct pp_rpc_stream *st);
/* Sends HopAck{id, code of status, message} on in's stream (ignored once the stream ended). */
void pp_stage_ack(struct pp_stage_inbound *in, uint64_t microbatch_id, pp_status status,
                  const char *message);
/* Ends every live inbound stream (all, or those of assignment gen when all is 0) with status. */
void pp_stage_inbound_finish_all(struct pp_stage *s, int all, uint64_t gen, pp_status status,
                                 const char *message);

/* ---- queue.c: the bounded FIFO between the streams and the compute thread ---- */
/* Takes mb (and a reference on mb->in); pauses mb->in's stream when the queue is full. */
void pp_stage_queue_push(struct pp_stage *s, struct pp_stage_mb *mb);
/* Blocks for the next item and resumes the streams paused while the queue was full; NULL once
 * pp_stage_queue_stop was called (what is left stays for pp_stage_queue_flush). */
struct pp_stage_mb *pp_stage_queue_pop(struct pp_stage *s);
/* The compute thread is done with mb: drops its reference, finishes a half-closed stream whose
 * last microbatch this was, frees mb. */
void pp_stage_queue_done(struct pp_stage *s, struct pp_stage_mb *mb);
void pp_stage_queue_stop(struct pp_stage *s);
/* Waits until nothing is queued or computing, or until deadline (monotonic); 1 when idle. */
int pp_stage_queue_wait_idle(struct pp_stage *s, double deadline);
/* Acks every queued microbatch with status/message and frees it (after the compute thread ended).
 */
void pp_stage_queue_flush(struct pp_stage *s, pp_status status, const char *message);
size_t pp_stage_queue_len(struct pp_stage *s);
/* Inbound stream lifetime: a reference is dropped under q_mu; at zero the stream is unlinked and
 * must be freed with pp_stage_inbound_free outside the lock. */
int pp_stage_inbound_unref_locked(struct pp_stage_inbound *in);
void pp_stage_inbound_free(struct pp_stage_inbound *in);
void pp_stage_mb_free(struct pp_stage_mb *mb);

/* ---- compute.c ---- */
pp_status pp_stage_compute_start(struct pp_stage *s);
/* Stops the thread after its current microbatch and joins it. */
void pp_stage_compute_stop(struct pp_stage *s);

/* ---- send.c: the outgoing hop ---- */
/* Opens Stage/Forward to target with its handshake (deliver 0), or Coordinator/Deliver (1). */
pp_status pp_stage_out_open(struct pp_stage *s, const char *target, int deliver,
                            const char *model_id, int32_t next_layer, size_t max_queued,
                            struct pp_stage_out **out);
/* Queues one message, which the hop owns from here on, first waiting while more than max_queued
 * are unwritten (a slow next hop), unless the stream ended or is closing, or the stage's grace
 * period is over. PP_ERR_UNAVAILABLE with the hop's error once it broke or closed. */
pp_status pp_stage_out_send(struct pp_stage_out *o, struct pp_rpc_msg *msg);
/* A reference for a sender outside mu; the hop is freed when the last one goes. NULL-safe unref. */
void pp_stage_out_ref(struct pp_stage_out *o);
void pp_stage_out_unref(struct pp_stage_out *o);
/* 1 once the hop broke; why receives "next hop ADDR: <detail>". */
int pp_stage_out_broken(struct pp_stage_out *o, char *why, size_t n);
/* Half-closes, waits up to timeout_ms for the end (then cancels), drops the assignment's
 * reference. NULL-safe. */
void pp_stage_out_close(struct pp_stage_out *o, int timeout_ms);

/* ---- sample.c: the last stage's token history and sampling ---- */
pp_status pp_stage_history_new(struct pp_stage_history **out);
void pp_stage_history_free(struct pp_stage_history *h);
/* Tokens held for id (0 when unknown). */
int32_t pp_stage_history_len(const struct pp_stage_history *h, uint64_t id);
/* Forgets id; returns 1 if it was known. */
int pp_stage_history_release(struct pp_stage_history *h, uint64_t id);

/* Before the forward pass: checks each part's sampling settings (parts with want_logits) and that
 * the history holds exactly pos tokens, and reserves room for the part's token ids so that the
 * append after the forward pass cannot fail. Nothing visible changes on error. */
pp_status pp_stage_sample_prepare(struct pp_stage_history *h,
                                  const Ppserve__V1__MicrobatchHeader *hdr);

/* The sampled tokens of one microbatch, ready to pack into Results. */
struct pp_stage_sampled {
    Ppserve__V1__SampledToken *tokens; /* [n] */
    Ppserve__V1__SampledToken **ptrs;  /* [n] */
    size_t n;
    float *raw; /* [parts with return_logits, vocab]: logits before sampling */
};

/* After a successful forward pass: appends every part's token ids to its history, then samples
 * one token per part with want_logits from logits[n_want, vocab] (modified in place), with step =
 * part->step, exactly as model/generate.c does. */
pp_status pp_stage_sample(struct pp_stage_history *h, struct pp_sampler *sampler, int32_t vocab,
                          const Ppserve__V1__MicrobatchHeader *hdr, float *logits,
                          struct pp_stage_sampled *out);
void pp_stage_sampled_free(struct pp_stage_sampled *o);

#endif
