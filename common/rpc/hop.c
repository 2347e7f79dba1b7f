/* Chunking, reassembly and validation of microbatches, and the hop handshake. */
#include "common/rpc/hop.h"

#include <stdio.h>
#include <string.h>

pp_status pp_hop_encode(Ppserve__V1__MicrobatchHeader *hdr, const void *payload, size_t len,
                        pp_hop_emit_fn emit, void *ud)
{
    hdr->total_bytes = len;
    pp_status st = PP_OK;
    size_t off = 0;
    uint32_t index = 0;
    do {
        size_t n = len - off < PP_RPC_CHUNK_BYTES ? len - off : PP_RPC_CHUNK_BYTES;
        Ppserve__V1__Chunk chunk = PPSERVE__V1__CHUNK__INIT;
        chunk.header = index == 0 ? hdr : NULL;
        chunk.microbatch_id = hdr->microbatch_id;
        chunk.index = index++;
        chunk.data.len = n;
        chunk.data.data = n ? (uint8_t *)payload + off : NULL;
        Ppserve__V1__HopMessage msg = PPSERVE__V1__HOP_MESSAGE__INIT;
        msg.body_case = PPSERVE__V1__HOP_MESSAGE__BODY_CHUNK;
        msg.chunk = &chunk;
        st = emit(ud, &msg.base);
        off += n;
    } while (st == PP_OK && off < len);
    return st;
}

pp_status pp_hop_handshake_pack(uint32_t version, const char *model_id, int32_t next_layer,
                                struct pp_buf *out)
{
    Ppserve__V1__Handshake hs = PPSERVE__V1__HANDSHAKE__INIT;
    hs.protocol_version = version;
    hs.model_id = (char *)model_id;
    hs.next_layer = next_layer;
    Ppserve__V1__HopMessage msg = PPSERVE__V1__HOP_MESSAGE__INIT;
    msg.body_case = PPSERVE__V1__HOP_MESSAGE__BODY_HANDSHAKE;
    msg.handshake = &hs;
    return pp_rpc_pack(&msg.base, out);
}

pp_status pp_hop_handshake_check(const Ppserve__V1__Handshake *got, uint32_t version,
                                 const char *model_id, int32_t next_layer)
{
    if (got->protocol_version != version)
        return pp_error(PP_ERR_INVALID_ARG, "handshake: protocol version %u, this side speaks %u",
                        got->protocol_version, version);
    if (strcmp(got->model_id ? got->model_id : "", model_id) != 0)
        return pp_error(PP_ERR_INVALID_ARG, "handshake: model %s, this side holds %s",
                        got->model_id && got->model_id[0] ? got->model_id : "(none)", model_id);
    if (got->next_layer != next_layer)
        return pp_error(PP_ERR_INVALID_ARG,
                        "handshake: the sender ends before layer %d, this side starts at layer %d",
                        got->next_layer, next_layer);
    return PP_OK;
}

void pp_hop_assembler_init(struct pp_hop_assembler *a, uint64_t max_bytes, int64_t expected_dim)
{
    memset(a, 0, sizeof(*a));
    a->max_bytes = max_bytes;
    a->expected_dim = expected_dim;
}

void pp_hop_assembler_reset(struct pp_hop_assembler *a)
{
    if (a->hdr)
        protobuf_c_message_free_unpacked(&a->hdr->base, NULL);
    a->hdr = NULL;
    a->payload.len = 0;
    a->next_index = 0;
}

/* The header against its own payload size and parts. */
static pp_status check_header(const struct pp_hop_assembler *a,
                              const Ppserve__V1__MicrobatchHeader *h)
{
    /* a microbatch some stage failed travels on to the end as its header alone */
    if (h->error && h->error[0]) {
        if (h->total_bytes != 0)
            return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu carries an error and %llu payload "
                            "bytes (expected none)", (unsigned long long)h->microbatch_id,
                            (unsigned long long)h->total_bytes);
        return PP_OK;
    }
    if (h->total_bytes > a->max_bytes)
        return pp_error(PP_ERR_EXHAUSTED, "microbatch %llu: %llu bytes, the limit is %llu",
                        (unsigned long long)h->microbatch_id, (unsigned long long)h->total_bytes,
                        (unsigned long long)a->max_bytes);
    int64_t rows = 0;
    for (size_t i = 0; i < h->n_parts; i++) {
        const Ppserve__V1__SeqPart *p = h->parts[i];
        if (p->n_tokens < 1 || p->pos < 0)
            return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: part %zu (sequence %llu) has "
                            "pos %d and %d tokens (expected pos >= 0, tokens >= 1)",
                            (unsigned long long)h->microbatch_id, i,
                            (unsigned long long)p->seq_id, p->pos, p->n_tokens);
        rows += p->n_tokens;
    }
    if (h->n_parts == 0)
        return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu has no sequences",
                        (unsigned long long)h->microbatch_id);
    int64_t want_cols = h->dtype == PPSERVE__V1__DTYPE__DTYPE_TOKEN_IDS ? 1 : a->expected_dim;
    size_t want_dims = h->dtype == PPSERVE__V1__DTYPE__DTYPE_TOKEN_IDS ? 1 : 2;
    if (h->dtype != PPSERVE__V1__DTYPE__DTYPE_TOKEN_IDS &&
        h->dtype != PPSERVE__V1__DTYPE__DTYPE_F32)
        return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: dtype %d (expected F32 activations "
                        "or TOKEN_IDS)", (unsigned long long)h->microbatch_id, (int)h->dtype);
    if (h->n_shape != want_dims || h->shape[0] != rows ||
        (want_dims == 2 && (h->shape[1] < 1 || (want_cols > 0 && h->shape[1] != want_cols)))) {
        char got[96] = "[", tail[64];
        size_t n = 1;
        for (size_t i = 0; i < h->n_shape && i < 4 && n < sizeof(got); i++)
            n += (size_t)snprintf(got + n, sizeof(got) - n, "%s%lld", i ? ", " : "",
                                  (long long)h->shape[i]);
        if (n < sizeof(got))
            snprintf(got + n, sizeof(got) - n, "%s]", h->n_shape > 4 ? ", ..." : "");
        if (want_dims == 1)
            snprintf(tail, sizeof(tail), " (expected [%lld] token ids)", (long long)rows);
        else if (want_cols > 0)
            snprintf(tail, sizeof(tail), " of width %lld", (long long)want_cols);
        else
            snprintf(tail, sizeof(tail), " of width >= 1");
        return pp_error(PP_ERR_INVALID_ARG,
                        "microbatch %llu: shape %s does not match %lld tokens%s",
                        (unsigned long long)h->microbatch_id, got, (long long)rows, tail);
    }
    /* a width the receiver does not fix (expected_dim 0) may be any int64: bound it before the
     * product, which would otherwise wrap and match a small payload */
    uint64_t cols = want_dims == 2 ? (uint64_t)h->shape[1] : 1;
    if (cols > UINT64_MAX / 4u / (uint64_t)rows)
        return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: shape [%lld, %lld] is too large "
                        "(expected at most %llu bytes)", (unsigned long long)h->microbatch_id,
                        (long long)rows, (long long)h->shape[1],
                        (unsigned long long)a->max_bytes);
    uint64_t want = (uint64_t)rows * cols * 4u;
    if (h->total_bytes != want)
        return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: %llu payload bytes announced, the "
                        "shape needs %llu", (unsigned long long)h->microbatch_id,
                        (unsigned long long)h->total_bytes, (unsigned long long)want);
    return PP_OK;
}

pp_status pp_hop_assembler_push(struct pp_hop_assembler *a, const Ppserve__V1__Chunk *c, int *done)
{
    *done = 0;
    pp_status st = PP_OK;
    if (c->index != a->next_index) {
        st = pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: chunk %u arrived, expected chunk %u",
                      (unsigned long long)c->microbatch_id, c->index, a->next_index);
    } else if (c->index == 0) {
        if (!c->header) {
            st = pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: the first chunk has no header",
                          (unsigned long long)c->microbatch_id);
        } else if (c->header->microbatch_id != c->microbatch_id) {
            st = pp_error(PP_ERR_INVALID_ARG, "chunk of microbatch %llu carries the header of %llu",
                          (unsigned long long)c->microbatch_id,
                          (unsigned long long)c->header->microbatch_id);
        } else if ((st = check_header(a, c->header)) == PP_OK) {
            /* keep our own copy of the header: the chunk's memory belongs to the caller */
            struct pp_buf tmp = {0};
            ProtobufCMessage *copy = NULL;
            st = pp_rpc_pack(&c->header->base, &tmp);
            if (st == PP_OK)
                st = pp_rpc_unpack(&ppserve__v1__microbatch_header__descriptor,
                                   (const uint8_t *)tmp.data, tmp.len, &copy);
            pp_buf_free(&tmp);
            a->hdr = (Ppserve__V1__MicrobatchHeader *)copy;
            a->payload.len = 0;
            /* the whole payload at once (check_header bounded it by max_bytes): no regrowth
             * copying what has arrived as each chunk comes */
            if (st == PP_OK && !pp_buf_reserve(&a->payload, (size_t)a->hdr->total_bytes)) {
                a->payload.failed = 0;
                st = pp_error(PP_ERR_NOMEM, "no memory for the %llu bytes of microbatch %llu",
                              (unsigned long long)a->hdr->total_bytes,
                              (unsigned long long)c->microbatch_id);
            }
        }
    } else if (c->header) {
        st = pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: chunk %u repeats the header",
                      (unsigned long long)c->microbatch_id, c->index);
    } else if (c->microbatch_id != a->hdr->microbatch_id) {
        st = pp_error(PP_ERR_INVALID_ARG, "chunk of microbatch %llu arrived inside microbatch %llu",
                      (unsigned long long)c->microbatch_id,
                      (unsigned long long)a->hdr->microbatch_id);
    }
    if (st == PP_OK && c->data.len > PP_RPC_CHUNK_BYTES)
        st = pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: chunk %u holds %zu bytes (at most %d)",
                      (unsigned long long)c->microbatch_id, c->index, c->data.len,
                      PP_RPC_CHUNK_BYTES);
    if (st == PP_OK && a->payload.len + c->data.len > a->hdr->total_bytes)
        st = pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: chunks carry more than the %llu bytes "
                      "announced", (unsigned long long)c->microbatch_id,
                      (unsigned long long)a->hdr->total_bytes);
    if (st == PP_OK) {
        pp_buf_put(&a->payload, c->data.data, c->data.len);
        if (a->payload.failed) {
            a->payload.failed = 0;
            st = pp_error(PP_ERR_NOMEM, "no memory for microbatch %llu",
                          (unsigned long long)c->microbatch_id);
        }
    }
    if (st != PP_OK) {
        pp_hop_assembler_reset(a);
        return st;
    }
    a->next_index++;
    *done = a->payload.len == a->hdr->total_bytes;
    return PP_OK;
}
