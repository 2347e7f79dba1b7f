/* The release thread: sends Release (free these sequences' KV) to every stage, off the scheduling
 * path, so that a slow or dead stage never stalls the others. Sequences are batched per call. */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "coordinator/coordinator.h"

#define RELEASE_TIMEOUT_MS 2000

void co_release_queue(struct coordinator *co, uint64_t seq_id, int32_t kv_blocks)
{
    if (co->n_release == co->cap_release) {
        int cap = co->cap_release ? co->cap_release * 2 : 64;
        struct co_release *q = pp_alloc(PP_MEM_MISC, (size_t)cap * sizeof(*q));
        if (q && co->n_release)
            memcpy(q, co->release_q, (size_t)co->n_release * sizeof(*q));
        if (q)
            pp_free(PP_MEM_MISC, co->release_q);
        if (!q) {
            PP_ERROR("release queue: out of memory; seq=%llu keeps its KV until the stages are "
                     "reassigned", (unsigned long long)seq_id);
            co->kv_blocks_reserved -= kv_blocks;
            return;
        }
        co->release_q = q;
        co->cap_release = cap;
    }
    co->release_q[co->n_release++] = (struct co_release){seq_id, kv_blocks, co->pipeline_gen};
    pthread_cond_broadcast(&co->cond);
}

static void *release_main(void *arg)
{
    struct coordinator *co = arg;
    pthread_mutex_lock(&co->mu);
    for (;;) {
        while (!co->stop && co->n_release == 0)
            pthread_cond_wait(&co->cond, &co->mu);
        if (co->n_release == 0)
            break; /* stopping with nothing left */
        int n = co->n_release;
        uint64_t *ids = pp_alloc(PP_MEM_MISC, (size_t)n * sizeof(*ids));
        struct co_release *batch = pp_alloc(PP_MEM_MISC, (size_t)n * sizeof(*batch));
        if (!ids || !batch) {
            pp_free(PP_MEM_MISC, ids);
            pp_free(PP_MEM_MISC, batch);
            pthread_cond_wait(&co->cond, &co->mu); /* try again on the next wake-up */
            continue;
        }
        memcpy(batch, co->release_q, (size_t)n * sizeof(*batch));
        for (int i = 0; i < n; i++)
            ids[i] = batch[i].seq_id;
        co->n_release = 0;
        struct pp_rpc_channel *chans[CO_MAX_STAGES];
        char addrs[CO_MAX_STAGES][256];
        int n_ch = 0;
        for (int i = 0; i < co->n_stages; i++)
            if (co->stages[i].ch && co->stages[i].alive) {
                chans[n_ch] = co->stages[i].ch;
                memcpy(addrs[n_ch++], co->stages[i].address, 256);
            }
        pthread_mutex_unlock(&co->mu);
        Ppserve__V1__ReleaseRequest req = PPSERVE__V1__RELEASE_REQUEST__INIT;
        req.n_seq_ids = (size_t)n;
        req.seq_ids = ids;
        for (int i = 0; i < n_ch; i++) {
            ProtobufCMessage *resp;
            if (pp_rpc_call(chans[i], "/ppserve.v1.Stage/Release", &req.base,
                            &ppserve__v1__release_response__descriptor, RELEASE_TIMEOUT_MS, &resp,
                            NULL) == PP_OK)
                protobuf_c_message_free_unpacked(resp, NULL);
            else
                PP_WARN("release of %d sequences on %s failed: %s", n, addrs[i],
                        pp_error_detail());
        }
        pp_free(PP_MEM_MISC, ids);
        pthread_mutex_lock(&co->mu);
        /* the stages have freed them (or are gone): admission may use the blocks again */
        for (int i = 0; i < n; i++)
            if (batch[i].pipeline_gen == co->pipeline_gen)
                co->kv_blocks_reserved -= batch[i].kv_blocks;
        pp_free(PP_MEM_MISC, batch);
        co_schedule(co);
        if (co->stop && co->n_release == 0)
            break;
    }
    pthread_mutex_unlock(&co->mu);
    return NULL;
}

pp_status co_release_start(struct coordinator *co)
{
    if (pthread_create(&co->release_thread, NULL, release_main, co) != 0)
        return pp_error(PP_ERR_INTERNAL, "cannot start the release thread");
    return PP_OK;
}

void co_release_stop(struct coordinator *co)
{
    pthread_mutex_lock(&co->mu);
    co->stop = 1;
    pthread_cond_broadcast(&co->cond);
    pthread_mutex_unlock(&co->mu);
    pthread_join(co->release_thread, NULL);
}
