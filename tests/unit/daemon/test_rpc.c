/* The gRPC layer with a real server and client on loopback: a unary method round trip, errors
 * mapped to gRPC codes with their messages, a malformed request, an unknown method, health checks,
 * a deadline, and message-size limits; the server keeps serving after each bad call. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/rpc/health.h"
#include "common/rpc/rpc.h"
#include "grpc/health/v1/health.pb-c.h"
#include "ppserve/v1/client.pb-c.h"
#include "testutil.h"

#define GRPC_INVALID_ARGUMENT 3
#define GRPC_DEADLINE_EXCEEDED 4
#define GRPC_NOT_FOUND 5
#define GRPC_RESOURCE_EXHAUSTED 8
#define GRPC_UNIMPLEMENTED 12
#define GRPC_UNAVAILABLE 14

struct fixture {
    struct pp_rpc_server *srv;
    struct pp_rpc_health *health;
    struct pp_rpc_channel *ch;
    char target[64];
};

/* Tokenize stand-in: one id per byte; "slow" sleeps; "fail" reports a clear error; "big" answers
 * with more than the message limit. */
static pp_status tokenize(void *ud, const ProtobufCMessage *req, struct pp_buf *resp)
{
    (void)ud;
    const Ppserve__V1__TokenizeRequest *r = (const void *)req;
    if (strcmp(r->text, "fail") == 0)
        return pp_error(PP_ERR_OUT_OF_RANGE, "prompt of 4 tokens exceeds the context of 2");
    if (strcmp(r->text, "slow") == 0)
        usleep(1500 * 1000);
    size_t n = strcmp(r->text, "big") == 0 ? (size_t)9 << 20 : strlen(r->text);
    int32_t *ids = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        ids[i] = i < strlen(r->text) ? (unsigned char)r->text[i] : 7;
    Ppserve__V1__TokenizeResponse out = PPSERVE__V1__TOKENIZE_RESPONSE__INIT;
    out.n_ids = n;
    out.ids = ids;
    pp_status st = pp_rpc_pack(&out.base, resp);
    free(ids);
    return st;
}

static int setup(void **state)
{
    static struct fixture f;
    struct pp_rpc_server_opts o = {"127.0.0.1:0", 2, 0};
    int port = 0;
    if (pp_rpc_server_new(&o, &f.srv) != PP_OK ||
        pp_rpc_server_add_unary(f.srv, "/ppserve.v1.Ppserve/Tokenize",
                                &ppserve__v1__tokenize_request__descriptor, tokenize,
                                NULL) != PP_OK ||
        pp_rpc_health_add(f.srv, &f.health) != PP_OK || pp_rpc_server_start(f.srv, &port) != PP_OK)
        return -1;
    snprintf(f.target, sizeof(f.target), "127.0.0.1:%d", port);
    if (pp_rpc_channel_new(f.target, &f.ch) != PP_OK)
        return -1;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    pp_rpc_channel_free(f->ch);
    pp_rpc_server_free(f->srv, 1000);
    pp_rpc_health_free(f->health);
    return 0;
}

static pp_status call_tokenize(struct fixture *f, const char *text, int64_t timeout_ms,
                               Ppserve__V1__TokenizeResponse **out, int *code)
{
    Ppserve__V1__TokenizeRequest req = PPSERVE__V1__TOKENIZE_REQUEST__INIT;
    req.text = (char *)text;
    return pp_rpc_call(f->ch, "/ppserve.v1.Ppserve/Tokenize", &req.base,
                       &ppserve__v1__tokenize_response__descriptor, timeout_ms,
                       (ProtobufCMessage **)out, code);
}

static void test_unary_round_trip(void **state)
{
    struct fixture *f = *state;
    Ppserve__V1__TokenizeResponse *resp = NULL;
    int code = -1;
    assert_int_equal(call_tokenize(f, "hey", 5000, &resp, &code), PP_OK);
    assert_int_equal(code, 0);
    assert_int_equal(resp->n_ids, 3);
    assert_int_equal(resp->ids[0], 'h');
    assert_int_equal(resp->ids[2], 'y');
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

static void test_error_status_and_message(void **state)
{
    struct fixture *f = *state;
    Ppserve__V1__TokenizeResponse *resp = NULL;
    int code = -1;
    assert_int_equal(call_tokenize(f, "fail", 5000, &resp, &code), PP_ERR_OUT_OF_RANGE);
    assert_int_equal(code, 11); /* OUT_OF_RANGE */
    assert_non_null(strstr(pp_error_detail(), "exceeds the context of 2"));
    assert_non_null(strstr(pp_error_detail(), "OUT_OF_RANGE"));
    test_unary_round_trip(state); /* still serving */
}

static void test_malformed_request(void **state)
{
    struct fixture *f = *state;
    static const uint8_t junk[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
    struct pp_buf out = {0};
    int code = -1;
    assert_int_equal(pp_rpc_call_raw(f->ch, "/ppserve.v1.Ppserve/Tokenize", junk, sizeof(junk),
                                     5000, &out, &code),
                     PP_ERR_INVALID_ARG);
    assert_int_equal(code, GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(pp_error_detail(), "malformed ppserve.v1.TokenizeRequest"));
    pp_buf_free(&out);
    test_unary_round_trip(state);
}

static void test_unknown_method(void **state)
{
    struct fixture *f = *state;
    struct pp_buf out = {0};
    int code = -1;
    assert_int_equal(pp_rpc_call_raw(f->ch, "/ppserve.v1.Ppserve/Nope", NULL, 0, 5000, &out, &code),
                     PP_ERR_UNSUPPORTED);
    assert_int_equal(code, GRPC_UNIMPLEMENTED);
    assert_non_null(strstr(pp_error_detail(), "unknown method /ppserve.v1.Ppserve/Nope"));
    pp_buf_free(&out);
    test_unary_round_trip(state);
}

static int health(struct fixture *f, const char *service, int *code)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    if (pp_rpc_call(f->ch, "/grpc.health.v1.Health/Check", &req.base,
                    &grpc__health__v1__health_check_response__descriptor, 5000,
                    (ProtobufCMessage **)&resp, code) != PP_OK)
        return -1;
    int st = resp->status;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return st;
}

static void test_health(void **state)
{
    struct fixture *f = *state;
    int code;
    assert_int_equal(health(f, "", &code), PP_HEALTH_NOT_SERVING);
    pp_rpc_health_set(f->health, "", PP_HEALTH_SERVING);
    pp_rpc_health_set(f->health, "ppserve.v1.Ppserve", PP_HEALTH_SERVING);
    assert_int_equal(health(f, "", &code), PP_HEALTH_SERVING);
    assert_int_equal(health(f, "ppserve.v1.Ppserve", &code), PP_HEALTH_SERVING);
    assert_int_equal(health(f, "other", &code), -1);
    assert_int_equal(code, GRPC_NOT_FOUND);
}

static void test_deadline(void **state)
{
    struct fixture *f = *state;
    Ppserve__V1__TokenizeResponse *resp = NULL;
    int code = -1;
    assert_int_not_equal(call_tokenize(f, "slow", 300, &resp, &code), PP_OK);
    assert_int_equal(code, GRPC_DEADLINE_EXCEEDED);
    test_unary_round_trip(state);
}

static void test_message_limits(void **state)
{
    struct fixture *f = *state;
    Ppserve__V1__TokenizeResponse *resp = NULL;
    int code = -1;
    /* a 9 MiB reply is over the 8 MiB limit: refused with RESOURCE_EXHAUSTED, never delivered */
    assert_int_not_equal(call_tokenize(f, "big", 10000, &resp, &code), PP_OK);
    assert_int_equal(code, GRPC_RESOURCE_EXHAUSTED);
    /* an oversized request is refused too */
    size_t n = (size_t)9 << 20;
    char *text = malloc(n + 1);
    memset(text, 'a', n);
    text[n] = '\0';
    assert_int_not_equal(call_tokenize(f, text, 10000, &resp, &code), PP_OK);
    assert_int_equal(code, GRPC_RESOURCE_EXHAUSTED);
    free(text);
    test_unary_round_trip(state);
}

static void test_unreachable_server(void **state)
{
    (void)state;
    struct pp_rpc_channel *ch;
    assert_int_equal(pp_rpc_channel_new("127.0.0.1:1", &ch), PP_OK);
    struct pp_buf out = {0};
    int code = -1;
    assert_int_equal(pp_rpc_call_raw(ch, "/x.Y/Z", NULL, 0, 2000, &out, &code), PP_ERR_UNAVAILABLE);
    assert_int_equal(code, GRPC_UNAVAILABLE);
    pp_buf_free(&out);
    pp_rpc_channel_free(ch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary_round_trip),   cmocka_unit_test(test_error_status_and_message),
        cmocka_unit_test(test_malformed_request),  cmocka_unit_test(test_unknown_method),
        cmocka_unit_test(test_health),             cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_message_limits),     cmocka_unit_test(test_unreachable_server),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
