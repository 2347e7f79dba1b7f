/* Streaming calls over real loopback sockets: a server stream of many messages in order, a
 * bidirectional echo with large messages, messages packed straight into gRPC's buffers (large
 * and small in turn, every byte checked in order), a client that goes away (the server notices),
 * a server that refuses or fails a stream (the client sees the status and message), and a
 * deadline. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rpc/rpc.h"
#include "ppserve/v1/stage.pb-c.h"
#include "testutil.h"

/* ---- the server side: "/t.T/Count" streams N numbered messages back for a request "N";
 * "/t.T/Echo" echoes every message, and ends OK on the client's half-close. */

struct server_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ended;
    pp_status end_status;
};

static struct server_state sv = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, PP_OK};

static void *open_stream(void *ud, struct pp_rpc_stream *st)
{
    (void)st;
    if (ud == (void *)2) {
        pp_error(PP_ERR_EXHAUSTED, "queue full (64 requests waiting)");
        return NULL;
    }
    return ud;
}

static void count_msg(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    (void)ud;
    char buf[32];
    snprintf(buf, sizeof(buf), "%.*s", (int)len, (const char *)data);
    int n = atoi(buf);
    if (n < 0) {
        pp_rpc_stream_finish(st, PP_ERR_INVALID_ARG, "count must be >= 0");
        return;
    }
    if (n == 999) /* never finishes: the client must give up or cancel */
        return;
    for (int i = 0; i < n; i++) {
        snprintf(buf, sizeof(buf), "%d", i);
        pp_rpc_stream_send(st, buf, strlen(buf));
    }
    pp_rpc_stream_finish(st, PP_OK, NULL);
}

static void echo_msg(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    (void)ud;
    pp_rpc_stream_send(st, data, len);
}

static void echo_half_close(void *ud, struct pp_rpc_stream *st)
{
    (void)ud;
    pp_rpc_stream_finish(st, PP_OK, NULL);
}

static void server_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    (void)ud;
    pthread_mutex_lock(&sv.mu);
    sv.ended++;
    sv.end_status = status;
    pthread_cond_broadcast(&sv.cv);
    pthread_mutex_unlock(&sv.mu);
    pp_rpc_stream_release(st);
}

/* "/t.T/Busy" ends every stream from inside open, before any message: the call can be over before
 * open returns, and on_end must still get the user data open returned. */
static int finish_bad_ud; /* sv.mu */

static void *open_and_finish(void *ud, struct pp_rpc_stream *st)
{
    (void)ud;
    pp_rpc_stream_finish(st, PP_ERR_PRECONDITION, "not ready");
    return &sv;
}

static void finish_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    pthread_mutex_lock(&sv.mu);
    finish_bad_ud += ud != &sv;
    pthread_mutex_unlock(&sv.mu);
    server_end(ud, st, status);
}

static const struct pp_rpc_stream_cbs count_cbs = {count_msg, NULL, server_end};
static const struct pp_rpc_stream_cbs finish_cbs = {count_msg, NULL, finish_end};
static const struct pp_rpc_stream_cbs echo_cbs = {echo_msg, echo_half_close, server_end};

/* ---- the client side: collects what arrives */

struct collector {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    size_t bytes;
    int in_order;
    int done;
    pp_status status;
    char detail[256];
    uint64_t digest; /* of every message's length and bytes, in order */
};

static uint64_t digest_add(uint64_t h, const uint8_t *data, size_t len)
{
    h = (h ^ len) * 1099511628211u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ data[i]) * 1099511628211u;
    return h;
}

static void collect_msg(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    (void)st;
    struct collector *c = ud;
    pthread_mutex_lock(&c->mu);
    char buf[32];
    snprintf(buf, sizeof(buf), "%.*s", (int)(len < 31 ? len : 31), (const char *)data);
    if (len < 16 && atoi(buf) != c->n)
        c->in_order = 0;
    c->n++;
    c->bytes += len;
    c->digest = digest_add(c->digest, data, len);
    pthread_mutex_unlock(&c->mu);
}

static void collect_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    (void)st;
    struct collector *c = ud;
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    c->status = status;
    snprintf(c->detail, sizeof(c->detail), "%s", status != PP_OK ? pp_error_detail() : "");
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static const struct pp_rpc_stream_cbs collect_cbs = {collect_msg, NULL, collect_end};

static void wait_done(struct collector *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->done)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void wait_server_end(int n)
{
    pthread_mutex_lock(&sv.mu);
    while (sv.ended < n)
        pthread_cond_wait(&sv.cv, &sv.mu);
    pthread_mutex_unlock(&sv.mu);
}

static struct pp_rpc_server *srv;
static struct pp_rpc_channel *ch;

static int setup(void **state)
{
    (void)state;
    struct pp_rpc_server_opts o = {"127.0.0.1:0", 2, 0};
    int port;
    if (pp_rpc_server_new(&o, &srv) != PP_OK ||
        pp_rpc_server_add_stream(srv, "/t.T/Count", open_stream, &count_cbs, (void *)1) ||
        pp_rpc_server_add_stream(srv, "/t.T/Echo", open_stream, &echo_cbs, (void *)1) ||
        pp_rpc_server_add_stream(srv, "/t.T/Full", open_stream, &count_cbs, (void *)2) ||
        pp_rpc_server_add_stream(srv, "/t.T/Busy", open_and_finish, &finish_cbs, NULL) ||
        pp_rpc_server_start(srv, &port) != PP_OK)
        return -1;
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    return pp_rpc_channel_new(target, &ch) == PP_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    pp_rpc_channel_free(ch);
    pp_rpc_server_free(srv, 1000);
    return 0;
}

static void init_collector(struct collector *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->in_order = 1;
}

static void test_server_stream_in_order(void **state)
{
    (void)state;
    struct collector c;
    init_collector(&c);
    struct pp_rpc_stream *st;
    int ended_before = sv.ended;
    assert_int_equal(pp_rpc_stream_open(ch, "/t.T/Count", 10000, &collect_cbs, &c, &st), PP_OK);
    assert_int_equal(pp_rpc_stream_send(st, "2000", 4), PP_OK);
    pp_rpc_stream_close_send(st);
    wait_done(&c);
    assert_int_equal(c.status, PP_OK);
    assert_int_equal(c.n, 2000);
    assert_true(c.in_order);
    pp_rpc_stream_release(st);
    wait_server_end(ended_before + 1);
}

static void test_bidi_echo_large(void **state)
{
    (void)state;
    struct collector c;
    init_collector(&c);
    struct pp_rpc_stream *st;
    assert_int_equal(pp_rpc_stream_open(ch, "/t.T/Echo", 30000, &collect_cbs, &c, &st), PP_OK);
    size_t len = PP_RPC_CHUNK_BYTES; /* a full activation chunk */
    char *big = malloc(len);
    memset(big, 'x', len);
    for (int i = 0; i < 24; i++)
        assert_int_equal(pp_rpc_stream_send(st, big, len), PP_OK);
    pp_rpc_stream_close_send(st);
    wait_done(&c);
    assert_int_equal(c.status, PP_OK);
    assert_int_equal(c.n, 24);
    assert_int_equal(c.bytes, 24 * len);
    free(big);
    pp_rpc_stream_release(st);
}

/* pp_rpc_msg_pack + pp_rpc_stream_send_msg (and pp_rpc_stream_send_packed): HopMessage chunks of
 * 1 MiB and of a few bytes in turn come back exactly as pp_rpc_pack packs them (a small message
 * after a large one is not read out of the large one's buffer), and a message given to a stream
 * that ended is freed. */
static void test_packed_messages(void **state)
{
    (void)state;
    struct collector c;
    init_collector(&c);
    struct pp_rpc_stream *st;
    assert_int_equal(pp_rpc_stream_open(ch, "/t.T/Echo", 30000, &collect_cbs, &c, &st), PP_OK);
    size_t big = PP_RPC_CHUNK_BYTES;
    uint8_t *payload = malloc(big);
    for (size_t i = 0; i < big; i++)
        payload[i] = (uint8_t)(i * 7 + i / 251);
    uint64_t want = 0;
    size_t want_bytes = 0;
    for (uint32_t i = 0; i < 8; i++) {
        Ppserve__V1__Chunk chunk = PPSERVE__V1__CHUNK__INIT;
        chunk.microbatch_id = 100 + i;
        chunk.index = i;
        chunk.data.len = i % 2 ? 3 + i : big - i;
        chunk.data.data = payload + i;
        Ppserve__V1__HopMessage msg = PPSERVE__V1__HOP_MESSAGE__INIT;
        msg.body_case = PPSERVE__V1__HOP_MESSAGE__BODY_CHUNK;
        msg.chunk = &chunk;
        struct pp_buf ref = {0};
        assert_int_equal(pp_rpc_pack(&msg.base, &ref), PP_OK);
        want = digest_add(want, (const uint8_t *)ref.data, ref.len);
        want_bytes += ref.len;
        pp_buf_free(&ref);
        if (i % 4 == 3) { /* both ways in: pack then send, or the two in one call */
            assert_int_equal(pp_rpc_stream_send_packed(st, &msg.base), PP_OK);
        } else {
            struct pp_rpc_msg *m;
            assert_int_equal(pp_rpc_msg_pack(&msg.base, &m), PP_OK);
            assert_int_equal(pp_rpc_stream_send_msg(st, m), PP_OK);
        }
    }
    pp_rpc_stream_close_send(st);
    wait_done(&c);
    assert_int_equal(c.status, PP_OK);
    assert_int_equal(c.n, 8);
    assert_int_equal(c.bytes, want_bytes);
    assert_true(c.digest == want);
    struct pp_rpc_msg *late;
    assert_int_equal(pp_rpc_msg_copy("late", 4, &late), PP_OK);
    assert_int_equal(pp_rpc_stream_send_msg(st, late), PP_ERR_IO); /* ended: freed, not leaked */
    free(payload);
    pp_rpc_stream_release(st);
}

static void test_client_goes_away(void **state)
{
    (void)state;
    struct collector c;
    init_collector(&c);
    struct pp_rpc_stream *st;
    int ended_before = sv.ended;
    assert_int_equal(pp_rpc_stream_open(ch, "/t.T/Count", 0, &collect_cbs, &c, &st), PP_OK);
    pp_rpc_stream_send(st, "999", 3);
    usleep(200 * 1000);
    pp_rpc_stream_cancel(st);
    wait_done(&c);
    assert_int_not_equal(c.status, PP_OK);
    wait_server_end(ended_before + 1); /* the server noticed */
    assert_int_equal(sv.end_status, PP_ERR_CANCELLED);
    pp_rpc_stream_release(st);
}

static void test_refused_and_failed_streams(void **state)
{
    (void)state;
    struct collector c;
    init_collector(&c);
    struct pp_rpc_stream *st;
    assert_int_equal(pp_rpc_stream_open(ch, "/t.T/Full", 5000, &collect_cbs, &c, &st), PP_OK);
    wait_done(&c);
    assert_int_equal(c.status, PP_ERR_UNAVAILABLE); /* UNAVAILABLE */
    assert_non_null(strstr(c.detail, "queue full"));
    pp_rpc_stream_release(st);

    init_collector(&c);
    assert_int_equal(pp_rpc_stream_open(ch, "/t.T/Count", 5000, &collect_cbs, &c, &st), PP_OK);
    pp_rpc_stream_send(st, "-1", 2);
    wait_done(&c);
    assert_int_equal(c.status, PP_ERR_INVALID_ARG);
    assert_non_null(strstr(c.detail, "INVALID_ARGUMENT: count must be >= 0"));
    assert_int_equal(pp_rpc_stream_send(st, "1", 1), PP_ERR_IO); /* ended */
    pp_rpc_stream_release(st);
}

static void test_finished_in_open(void **state)
{
    (void)state;
    for (int i = 0; i < 50; i++) {
        struct collector c;
        init_collector(&c);
        struct pp_rpc_stream *st;
        int ended_before = sv.ended;
        assert_int_equal(pp_rpc_stream_open(ch, "/t.T/Busy", 5000, &collect_cbs, &c, &st), PP_OK);
        wait_done(&c);
        assert_int_equal(c.status, PP_ERR_PRECONDITION);
        assert_non_null(strstr(c.detail, "FAILED_PRECONDITION: not ready"));
        pp_rpc_stream_release(st);
        wait_server_end(ended_before + 1);
    }
    assert_int_equal(finish_bad_ud, 0);
}

static void test_deadline(void **state)
{
    (void)state;
    struct collector c;
    init_collector(&c);
    struct pp_rpc_stream *st;
    assert_int_equal(pp_rpc_stream_open(ch, "/t.T/Count", 300, &collect_cbs, &c, &st), PP_OK);
    pp_rpc_stream_send(st, "999", 3);
    wait_done(&c);
    assert_non_null(strstr(c.detail, "DEADLINE_EXCEEDED"));
    pp_rpc_stream_release(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_stream_in_order),
        cmocka_unit_test(test_bidi_echo_large),
        cmocka_unit_test(test_packed_messages),
        cmocka_unit_test(test_client_goes_away),
        cmocka_unit_test(test_refused_and_failed_streams),
        cmocka_unit_test(test_finished_in_open),
        cmocka_unit_test(test_deadline),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
