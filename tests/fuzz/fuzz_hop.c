/* libFuzzer target: the data plane's receiving side on arbitrary bytes, as a stage's inbound hop
 * sees them. The input is a run of records (a kind byte, a 16-bit length, that many bytes): each
 * is a HopMessage to unpack and hand to the handshake check or the chunk assembler, a bare Chunk,
 * or a reset of the assembler. A microbatch the assembler completes must be what the compute side
 * relies on (common/rpc/hop.h): a header, and a payload of exactly the announced bytes that fits
 * the shape and the parts; anything else aborts so the fuzzer reports it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/rpc/hop.h"

#define MAX_BYTES (1u << 20)

/* The contract of a completed microbatch. */
static void check_done(const struct pp_hop_assembler *a, int64_t dim)
{
    const Ppserve__V1__MicrobatchHeader *h = a->hdr;
    if (!h || a->payload.len != h->total_bytes || h->total_bytes > MAX_BYTES)
        abort();
    if (h->error && h->error[0]) {
        if (h->total_bytes != 0)
            abort();
        return;
    }
    int64_t rows = 0;
    for (size_t i = 0; i < h->n_parts; i++) {
        if (h->parts[i]->n_tokens < 1 || h->parts[i]->pos < 0)
            abort();
        rows += h->parts[i]->n_tokens;
    }
    if (h->n_parts == 0 || h->n_shape < 1 || h->shape[0] != rows)
        abort();
    if (h->dtype == PPSERVE__V1__DTYPE__DTYPE_TOKEN_IDS) {
        if (h->n_shape != 1 || (uint64_t)rows * 4u != h->total_bytes)
            abort();
    } else if (h->dtype == PPSERVE__V1__DTYPE__DTYPE_F32) {
        if (h->n_shape != 2 || h->shape[1] < 1 || (dim > 0 && h->shape[1] != dim) ||
            h->total_bytes / 4u / (uint64_t)rows != (uint64_t)h->shape[1] ||
            h->total_bytes % (4u * (uint64_t)rows) != 0)
            abort();
    } else {
        abort();
    }
}

/* Seeds: records of real messages, written by pp_hop_handshake_pack and pp_hop_encode. */
static void put_record(FILE *f, uint8_t kind, const struct pp_buf *b)
{
    uint8_t hdr[3] = {kind, (uint8_t)(b->len & 0xff), (uint8_t)(b->len >> 8)};
    fwrite(hdr, 1, 3, f);
    fwrite(b->data, 1, b->len, f);
}

static pp_status put_message(void *ud, const ProtobufCMessage *msg)
{
    struct pp_buf b = {0};
    pp_status st = pp_rpc_pack(msg, &b);
    if (st == PP_OK)
        put_record(ud, 0, &b);
    pp_buf_free(&b);
    return st;
}

/* A handshake, then a microbatch of two sequences (3 + 2 tokens) as f32 rows of width 4, or as
 * token ids, or a failed one that carries only its error. */
static void write_seed(const char *dir, const char *name, int kind)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    fputc(1, f); /* width fixed at 4 */
    struct pp_buf b = {0};
    if (pp_hop_handshake_pack(1, "model", 3, &b) != PP_OK)
        abort();
    put_record(f, 0, &b);
    pp_buf_free(&b);
    Ppserve__V1__SeqPart p[2], *pp[2] = {&p[0], &p[1]};
    ppserve__v1__seq_part__init(&p[0]);
    ppserve__v1__seq_part__init(&p[1]);
    p[0].seq_id = 1, p[0].n_tokens = 3;
    p[1].seq_id = 2, p[1].pos = 7, p[1].n_tokens = 2;
    Ppserve__V1__MicrobatchHeader h = PPSERVE__V1__MICROBATCH_HEADER__INIT;
    h.microbatch_id = 5;
    h.n_parts = 2;
    h.parts = pp;
    int64_t shape[2] = {5, 4};
    h.shape = shape;
    float payload[20] = {0};
    size_t len = 0;
    if (kind == 0) {
        h.dtype = PPSERVE__V1__DTYPE__DTYPE_F32;
        h.n_shape = 2;
        len = sizeof(payload);
    } else if (kind == 1) {
        h.dtype = PPSERVE__V1__DTYPE__DTYPE_TOKEN_IDS;
        h.n_shape = 1;
        len = 5 * 4;
    } else {
        h.error = "stage 0 (layers 0..3): out of memory";
    }
    if (pp_hop_encode(&h, payload, len, put_message, f) != PP_OK)
        abort();
    fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("PP_FUZZ_SEED_OUT");
    if (dir) {
        write_seed(dir, "f32", 0);
        write_seed(dir, "token-ids", 1);
        write_seed(dir, "error", 2);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    /* the first byte picks whether the receiver fixes the activations' width */
    int64_t dim = data[0] & 1 ? 4 : 0;
    struct pp_hop_assembler a;
    pp_hop_assembler_init(&a, MAX_BYTES, dim);
    size_t off = 1;
    while (off + 3 <= size) {
        uint8_t kind = data[off];
        size_t len = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
        off += 3;
        if (len > size - off)
            len = size - off;
        const uint8_t *msg = data + off;
        off += len;
        int done = 0;
        switch (kind % 3) {
        case 0: {
            ProtobufCMessage *m = NULL;
            if (pp_rpc_unpack(&ppserve__v1__hop_message__descriptor, msg, len, &m) != PP_OK)
                break;
            Ppserve__V1__HopMessage *hm = (Ppserve__V1__HopMessage *)m;
            if (hm->body_case == PPSERVE__V1__HOP_MESSAGE__BODY_HANDSHAKE)
                (void)pp_hop_handshake_check(hm->handshake, 1, "model", 3);
            else if (hm->body_case == PPSERVE__V1__HOP_MESSAGE__BODY_CHUNK &&
                     pp_hop_assembler_push(&a, hm->chunk, &done) == PP_OK && done) {
                check_done(&a, dim);
                pp_hop_assembler_reset(&a);
            }
            protobuf_c_message_free_unpacked(m, NULL);
            break;
        }
        case 1: {
            ProtobufCMessage *m = NULL;
            if (pp_rpc_unpack(&ppserve__v1__chunk__descriptor, msg, len, &m) != PP_OK)
                break;
            if (pp_hop_assembler_push(&a, (Ppserve__V1__Chunk *)m, &done) == PP_OK && done) {
                check_done(&a, dim);
                pp_hop_assembler_reset(&a);
            }
            protobuf_c_message_free_unpacked(m, NULL);
            break;
        }
        default:
            pp_hop_assembler_reset(&a);
        }
    }
    pp_hop_assembler_reset(&a);
    pp_buf_free(&a.payload);
    return 0;
}
