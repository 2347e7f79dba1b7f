/* Framing of the pipeline's data plane (proto/ppserve/v1/stage.proto): a microbatch travels as
 * HopMessage chunks of at most PP_RPC_CHUNK_BYTES of payload, its header on the first chunk; the
 * receiver reassembles and validates it (order, ids, sizes, dtype and shape against the payload and
 * the parts) before any of it reaches a model; and the handshake that opens every hop. Shared by
 * the coordinator and the stages, which meet only on the wire. */
#ifndef PP_RPC_HOP_H
#define PP_RPC_HOP_H

#include "common/buf.h"
#include "common/rpc/rpc.h"
#include "ppserve/v1/stage.pb-c.h"

/* emit gets one HopMessage at a time, to pack where it will be sent from (pp_rpc_msg_pack: the
 * payload is copied once, into gRPC's buffer); its chunk points into the caller's payload and lives
 * until emit returns. A non-OK return stops the encoding. */
typedef pp_status (*pp_hop_emit_fn)(void *ud, const ProtobufCMessage *msg);

/* Sends hdr and payload[len] as chunks (at least one, even for an empty payload). hdr->total_bytes
 * and microbatch ids are set from the arguments. */
pp_status pp_hop_encode(Ppserve__V1__MicrobatchHeader *hdr, const void *payload, size_t len,
                        pp_hop_emit_fn emit, void *ud);

/* Packs a handshake HopMessage into out. */
pp_status pp_hop_handshake_pack(uint32_t version, const char *model_id, int32_t next_layer,
                                struct pp_buf *out);

/* Checks a peer's handshake against what this side expects; the message says what differed. */
pp_status pp_hop_handshake_check(const Ppserve__V1__Handshake *got, uint32_t version,
                                 const char *model_id, int32_t next_layer);

struct pp_hop_assembler {
    Ppserve__V1__MicrobatchHeader *hdr; /* from the first chunk; owned */
    struct pp_buf payload;
    uint32_t next_index;
    uint64_t max_bytes;    /* refuse microbatches larger than this */
    int64_t expected_dim;  /* activations' row width; 0: not checked */
};

void pp_hop_assembler_init(struct pp_hop_assembler *a, uint64_t max_bytes, int64_t expected_dim);
/* Frees what a partial microbatch holds and gets ready for the next one. */
void pp_hop_assembler_reset(struct pp_hop_assembler *a);

/* Adds one chunk. *done = 1 when the microbatch is complete and valid: a->hdr and a->payload hold
 * it until the next reset. A header with `error` set must announce no payload; its dtype, shape and
 * parts are not checked (it is passed on, never computed). Any error leaves the assembler reset. */
pp_status pp_hop_assembler_push(struct pp_hop_assembler *a, const Ppserve__V1__Chunk *c, int *done);

#endif
