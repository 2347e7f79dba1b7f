/* Data-plane framing: microbatches survive chunking byte for byte, every malformed sequence of
 * chunks is refused with a message that says what was expected and what arrived, and the handshake
 * names what differs. */
#include <stdlib.h>
#include <string.h>

#include "common/rpc/hop.h"
#include "testutil.h"

#define DIM 4096

struct sink {
    Ppserve__V1__HopMessage *msgs[64];
    int n;
};

/* Packs each message and reads it back, as the wire does. */
static pp_status collect(void *ud, const ProtobufCMessage *msg)
{
    struct sink *s = ud;
    struct pp_buf b = {0};
    ProtobufCMessage *m = NULL;
    pp_status st = pp_rpc_pack(msg, &b);
    if (st == PP_OK)
        st = pp_rpc_unpack(&ppserve__v1__hop_message__descriptor, (const uint8_t *)b.data, b.len,
                           &m);
    pp_buf_free(&b);
    if (st == PP_OK)
        s->msgs[s->n++] = (Ppserve__V1__HopMessage *)m;
    return st;
}

static void sink_free(struct sink *s)
{
    for (int i = 0; i < s->n; i++)
        protobuf_c_message_free_unpacked(&s->msgs[i]->base, NULL);
    s->n = 0;
}

/* A microbatch of two sequences (100 + 60 tokens) of DIM-wide f32 activations: 2.5 MiB. */
static void make(Ppserve__V1__MicrobatchHeader *h, Ppserve__V1__SeqPart *p,
                 Ppserve__V1__SeqPart **pp, int64_t *shape, float **data)
{
    ppserve__v1__seq_part__init(&p[0]);
    ppserve__v1__seq_part__init(&p[1]);
    p[0].seq_id = 7, p[0].pos = 0, p[0].n_tokens = 100;
    p[1].seq_id = 9, p[1].pos = 33, p[1].n_tokens = 60;
    pp[0] = &p[0], pp[1] = &p[1];
    ppserve__v1__microbatch_header__init(h);
    h->microbatch_id = 42;
    h->n_parts = 2;
    h->parts = pp;
    h->dtype = PPSERVE__V1__DTYPE__DTYPE_F32;
    shape[0] = 160, shape[1] = DIM;
    h->n_shape = 2;
    h->shape = shape;
    *data = malloc(160 * DIM * sizeof(float));
    for (int i = 0; i < 160 * DIM; i++)
        (*data)[i] = (float)i * 0.5f;
}

static void test_round_trip(void **state)
{
    (void)state;
    Ppserve__V1__MicrobatchHeader h;
    Ppserve__V1__SeqPart p[2], *pp[2];
    int64_t shape[2];
    float *data;
    make(&h, p, pp, shape, &data);
    struct sink s = {0};
    assert_int_equal(pp_hop_encode(&h, data, 160 * DIM * 4, collect, &s), PP_OK);
    assert_int_equal(s.n, 3); /* 2.5 MiB in chunks of at most 1 MiB */
    struct pp_hop_assembler a;
    pp_hop_assembler_init(&a, 64 << 20, DIM);
    int done = 0;
    char *first_data = NULL;
    for (int i = 0; i < s.n; i++) {
        assert_int_equal(s.msgs[i]->body_case, PPSERVE__V1__HOP_MESSAGE__BODY_CHUNK);
        assert_int_equal(pp_hop_assembler_push(&a, s.msgs[i]->chunk, &done), PP_OK);
        assert_int_equal(done, i == s.n - 1);
        /* the header's size is reserved at once: later chunks never move what arrived */
        if (i == 0)
            first_data = a.payload.data;
        assert_true(a.payload.cap > 160 * DIM * 4 && a.payload.data == first_data);
    }
    assert_int_equal(a.payload.len, 160 * DIM * 4);
    assert_memory_equal(a.payload.data, data, 160 * DIM * 4);
    assert_int_equal(a.hdr->n_parts, 2);
    assert_int_equal(a.hdr->parts[1]->seq_id, 9);
    assert_int_equal(a.hdr->parts[1]->pos, 33);
    pp_hop_assembler_reset(&a);
    pp_buf_free(&a.payload);
    sink_free(&s);
    free(data);
}

static void expect(pp_status st, const char *needle)
{
    assert_int_not_equal(st, PP_OK);
    if (!strstr(pp_error_detail(), needle))
        fail_msg("'%s' not in '%s'", needle, pp_error_detail());
}

static void test_bad_sequences(void **state)
{
    (void)state;
    Ppserve__V1__MicrobatchHeader h;
    Ppserve__V1__SeqPart p[2], *pp[2];
    int64_t shape[2];
    float *data;
    make(&h, p, pp, shape, &data);
    struct sink s = {0};
    assert_int_equal(pp_hop_encode(&h, data, 160 * DIM * 4, collect, &s), PP_OK);
    struct pp_hop_assembler a;
    pp_hop_assembler_init(&a, 64 << 20, DIM);
    int done;

    expect(pp_hop_assembler_push(&a, s.msgs[1]->chunk, &done), "chunk 1 arrived, expected chunk 0");
    assert_int_equal(pp_hop_assembler_push(&a, s.msgs[0]->chunk, &done), PP_OK);
    expect(pp_hop_assembler_push(&a, s.msgs[2]->chunk, &done), "chunk 2 arrived, expected chunk 1");
    /* after an error the assembler starts over cleanly */
    for (int i = 0; i < 3; i++)
        assert_int_equal(pp_hop_assembler_push(&a, s.msgs[i]->chunk, &done), PP_OK);
    assert_true(done);
    pp_hop_assembler_reset(&a);

    /* a chunk 0 without its header, a later chunk with one */
    Ppserve__V1__Chunk c0 = *s.msgs[0]->chunk;
    c0.header = NULL;
    expect(pp_hop_assembler_push(&a, &c0, &done), "the first chunk has no header");
    assert_int_equal(pp_hop_assembler_push(&a, s.msgs[0]->chunk, &done), PP_OK);
    Ppserve__V1__Chunk c1 = *s.msgs[1]->chunk;
    c1.header = s.msgs[0]->chunk->header;
    expect(pp_hop_assembler_push(&a, &c1, &done), "chunk 1 repeats the header");

    /* shapes that do not match the parts, the receiver's width or the payload */
    Ppserve__V1__Chunk bad = *s.msgs[0]->chunk;
    Ppserve__V1__MicrobatchHeader hb = *s.msgs[0]->chunk->header;
    int64_t wrong[2] = {160, 2048};
    hb.shape = wrong;
    bad.header = &hb;
    expect(pp_hop_assembler_push(&a, &bad, &done), "does not match 160 tokens of width 4096");
    wrong[0] = 150, wrong[1] = DIM;
    expect(pp_hop_assembler_push(&a, &bad, &done), "shape [150, 4096] does not match 160 tokens");
    wrong[0] = 160;
    hb.total_bytes = 12;
    expect(pp_hop_assembler_push(&a, &bad, &done), "12 payload bytes announced, the shape needs");
    hb.total_bytes = 160 * DIM * 4;
    hb.dtype = 77;
    expect(pp_hop_assembler_push(&a, &bad, &done), "dtype 77");

    /* a receiver that does not fix the width: a width whose payload size wraps around 2^64 to
     * the announced bytes is refused, not taken */
    struct pp_hop_assembler any;
    pp_hop_assembler_init(&any, 64 << 20, 0);
    hb.dtype = PPSERVE__V1__DTYPE__DTYPE_F32;
    wrong[0] = 1, wrong[1] = (int64_t)1 << 62;
    Ppserve__V1__SeqPart one = *p;
    one.n_tokens = 1;
    Ppserve__V1__SeqPart *onep = &one;
    hb.n_parts = 1;
    hb.parts = &onep;
    hb.total_bytes = 0;
    expect(pp_hop_assembler_push(&any, &bad, &done), "shape [1, 4611686018427387904] is too large");
    wrong[1] = 5;
    hb.total_bytes = 20;
    bad.data.len = 20;
    assert_int_equal(pp_hop_assembler_push(&any, &bad, &done), PP_OK);
    assert_true(done);
    pp_hop_assembler_reset(&any);
    pp_buf_free(&any.payload);

    /* a microbatch over the receiver's limit */
    struct pp_hop_assembler small;
    pp_hop_assembler_init(&small, 1 << 20, DIM);
    expect(pp_hop_assembler_push(&small, s.msgs[0]->chunk, &done), "the limit is 1048576");

    pp_hop_assembler_reset(&a);
    pp_buf_free(&a.payload);
    pp_buf_free(&small.payload);
    sink_free(&s);
    free(data);
}

static void test_handshake(void **state)
{
    (void)state;
    struct pp_buf b = {0};
    assert_int_equal(pp_hop_handshake_pack(1, "sha256:abc", 8, &b), PP_OK);
    ProtobufCMessage *m;
    assert_int_equal(pp_rpc_unpack(&ppserve__v1__hop_message__descriptor, (uint8_t *)b.data,
                                   b.len, &m),
                     PP_OK);
    const Ppserve__V1__Handshake *hs = ((Ppserve__V1__HopMessage *)m)->handshake;
    assert_int_equal(pp_hop_handshake_check(hs, 1, "sha256:abc", 8), PP_OK);
    expect(pp_hop_handshake_check(hs, 2, "sha256:abc", 8),
           "protocol version 1, this side speaks 2");
    expect(pp_hop_handshake_check(hs, 1, "sha256:def", 8),
           "model sha256:abc, this side holds sha256:def");
    expect(pp_hop_handshake_check(hs, 1, "sha256:abc", 12),
           "the sender ends before layer 8, this side starts at layer 12");
    protobuf_c_message_free_unpacked(m, NULL);
    pp_buf_free(&b);
}

/* A microbatch a stage failed travels as its header alone: no payload, whatever its shape says;
 * an error header that still announces payload bytes is refused. */
static void test_error_header(void **state)
{
    (void)state;
    Ppserve__V1__MicrobatchHeader h;
    Ppserve__V1__SeqPart p[2], *pp[2];
    int64_t shape[2];
    float *data;
    make(&h, p, pp, shape, &data);
    h.error = "sequence 9: expected pos 0 (tokens held), got 33";
    h.error_code = 3;
    struct sink s = {0};
    assert_int_equal(pp_hop_encode(&h, NULL, 0, collect, &s), PP_OK);
    assert_int_equal(s.n, 1);
    struct pp_hop_assembler a;
    pp_hop_assembler_init(&a, 64 << 20, DIM);
    int done = 0;
    assert_int_equal(pp_hop_assembler_push(&a, s.msgs[0]->chunk, &done), PP_OK);
    assert_int_equal(done, 1);
    assert_string_equal(a.hdr->error, h.error);
    assert_int_equal(a.hdr->error_code, 3);
    assert_int_equal(a.payload.len, 0);
    pp_hop_assembler_reset(&a);
    sink_free(&s);

    s.msgs[0] = NULL;
    Ppserve__V1__Chunk c = PPSERVE__V1__CHUNK__INIT;
    h.total_bytes = 16;
    c.header = &h;
    c.microbatch_id = h.microbatch_id;
    expect(pp_hop_assembler_push(&a, &c, &done), "carries an error and 16 payload bytes");
    pp_hop_assembler_reset(&a);
    pp_buf_free(&a.payload);
    free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_sequences),
        cmocka_unit_test(test_handshake),
        cmocka_unit_test(test_error_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
