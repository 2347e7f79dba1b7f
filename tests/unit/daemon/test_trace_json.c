/* The Chrome-trace writer of `ppserve trace` (client/remote/trace_json.c): every output is parsed
 * back with jansson and checked event by event: rows named from the status's layer ranges (or
 * "stage N" without them), receive and compute spans on their stage's row, the coordinator's row,
 * times in microseconds from the earliest timestamp, unrecorded spans left out, skewed clocks
 * giving dur 0, an empty trace still a valid document, and an allocation failure reported.
 *
 * The writer is part of the ppserve executable, not of a library the tests link, so it is compiled
 * into this test directly. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "client/remote/trace_json.h"
#include "common/alloc.h"
#include "testutil.h"

#define T0 1700000000.0 /* an epoch time like the daemons send */

/* A trace of n microbatches over two stages: microbatch i is sent at T0 + 10 ms * i, stage s
 * receives 100 µs + 4 ms * s later for 200 µs and computes for 3 ms right after; delivered 8 ms
 * after sending. */
struct fake_trace {
    Ppserve__V1__TraceResponse tr;
    Ppserve__V1__MicrobatchTrace mb[4];
    Ppserve__V1__MicrobatchTrace *mbp[4];
    Ppserve__V1__StageSpan sp[4][2];
    Ppserve__V1__StageSpan *spp[4][2];
};

static void fake_trace_init(struct fake_trace *f, int n)
{
    Ppserve__V1__TraceResponse tr = PPSERVE__V1__TRACE_RESPONSE__INIT;
    f->tr = tr;
    for (int i = 0; i < n; i++) {
        Ppserve__V1__MicrobatchTrace m = PPSERVE__V1__MICROBATCH_TRACE__INIT;
        f->mb[i] = m;
        f->mbp[i] = &f->mb[i];
        f->mb[i].microbatch_id = 40 + (uint64_t)i;
        f->mb[i].n_seqs = 2;
        f->mb[i].n_tokens = i == 0 ? 17 : 2;
        double t = T0 + 0.010 * i;
        f->mb[i].sent = t;
        f->mb[i].delivered = t + 0.008;
        for (int s = 0; s < 2; s++) {
            Ppserve__V1__StageSpan x = PPSERVE__V1__STAGE_SPAN__INIT;
            f->sp[i][s] = x;
            f->spp[i][s] = &f->sp[i][s];
            f->sp[i][s].stage = (uint32_t)s;
            f->sp[i][s].recv_start = t + 0.0001 + 0.004 * s;
            f->sp[i][s].recv_end = f->sp[i][s].recv_start + 0.0002;
            f->sp[i][s].compute_start = f->sp[i][s].recv_end;
            f->sp[i][s].compute_end = f->sp[i][s].compute_start + 0.003;
        }
        f->mb[i].n_spans = 2;
        f->mb[i].spans = f->spp[i];
    }
    f->tr.n_microbatches = (size_t)n;
    f->tr.microbatches = f->mbp;
}

/* Parses out; fails the test with the parser's message when it is not JSON. */
static json_t *parse(const struct pp_buf *out)
{
    assert_false(out->failed);
    assert_non_null(out->data);
    json_error_t err;
    json_t *v = json_loads(out->data, 0, &err);
    if (!v)
        fail_msg("invalid JSON: %s at %d in\n%s", err.text, err.position, out->data);
    assert_true(json_is_array(json_object_get(v, "traceEvents")));
    return v;
}

/* The event with this name (and tid, when tid >= 0); NULL when absent. */
static json_t *find(json_t *doc, const char *name, json_int_t tid)
{
    json_t *events = json_object_get(doc, "traceEvents"), *e;
    size_t i;
    json_array_foreach(events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "name")), name) == 0 &&
            (tid < 0 || json_integer_value(json_object_get(e, "tid")) == tid))
            return e;
    }
    return NULL;
}

/* The name a thread_name metadata event gives row tid; NULL when none. */
static const char *row_name(json_t *doc, json_int_t tid)
{
    json_t *events = json_object_get(doc, "traceEvents"), *e;
    size_t i;
    json_array_foreach(events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "name")), "thread_name") == 0 &&
            json_integer_value(json_object_get(e, "tid")) == tid)
            return json_string_value(json_object_get(json_object_get(e, "args"), "name"));
    }
    return NULL;
}

static int count_ph(json_t *doc, const char *ph)
{
    json_t *events = json_object_get(doc, "traceEvents"), *e;
    size_t i;
    int n = 0;
    json_array_foreach(events, i, e)
        n += strcmp(json_string_value(json_object_get(e, "ph")), ph) == 0;
    return n;
}

static double num(json_t *e, const char *key)
{
    json_t *v = json_object_get(e, key);
    assert_true(json_is_number(v));
    return json_number_value(v);
}

/* Times agree to half a microsecond: epoch seconds in a double keep about 0.2 µs. */
static void assert_us(double got, double want)
{
    if (fabs(got - want) > 0.5)
        fail_msg("expected %.3f µs, got %.3f", want, got);
}

static void test_events_and_rows(void **state)
{
    (void)state;
    struct fake_trace f;
    fake_trace_init(&f, 2);
    Ppserve__V1__StatusResponse st = PPSERVE__V1__STATUS_RESPONSE__INIT;
    Ppserve__V1__StageStatus s0 = PPSERVE__V1__STAGE_STATUS__INIT;
    Ppserve__V1__StageStatus s1 = PPSERVE__V1__STAGE_STATUS__INIT;
    Ppserve__V1__StageStatus *ss[2] = {&s1, &s0}; /* any order: rows go by index */
    s0.index = 0;
    s0.first_layer = 0;
    s0.last_layer = 3;
    s1.index = 1;
    s1.first_layer = 3;
    s1.last_layer = 8;
    st.n_stages = 2;
    st.stages = ss;

    struct pp_buf out = {0};
    struct pp_trace_summary sum;
    assert_int_equal(pp_trace_json_write(&f.tr, &st, &out, &sum), PP_OK);
    json_t *doc = parse(&out);

    assert_int_equal(sum.microbatches, 2);
    assert_int_equal(sum.stages, 2);
    assert_int_equal(sum.events, 2 * (1 + 2 * 2));
    assert_true(fabs(sum.span_s - 0.018) < 1e-6);
    assert_int_equal(count_ph(doc, "X"), 10);

    assert_string_equal(row_name(doc, 0), "stage 0 [0,3)");
    assert_string_equal(row_name(doc, 1), "stage 1 [3,8)");
    assert_string_equal(row_name(doc, PP_TRACE_COORDINATOR_TID), "coordinator");

    /* the coordinator's span of the first microbatch starts the timeline */
    json_t *e = find(doc, "mb 40", PP_TRACE_COORDINATOR_TID);
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "ph")), "X");
    assert_int_equal(json_integer_value(json_object_get(e, "pid")), 1);
    assert_us(num(e, "ts"), 0.0);
    assert_us(num(e, "dur"), 8000.0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(e, "args"), "n_seqs")), 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(e, "args"), "n_tokens")),
                     17);

    /* the second microbatch on stage 1: receive, then compute, on row 1 */
    e = find(doc, "mb 41 recv", 1);
    assert_non_null(e);
    assert_us(num(e, "ts"), 10000.0 + 100.0 + 4000.0);
    assert_us(num(e, "dur"), 200.0);
    e = find(doc, "mb 41 compute", 1);
    assert_non_null(e);
    assert_us(num(e, "ts"), 10000.0 + 100.0 + 4000.0 + 200.0);
    assert_us(num(e, "dur"), 3000.0);
    json_t *args = json_object_get(e, "args");
    assert_int_equal(json_integer_value(json_object_get(args, "n_tokens")), 2);
    assert_non_null(find(doc, "mb 40 compute", 0));
    assert_null(find(doc, "mb 40 compute", 2));

    /* where ts 0 is in wall-clock time */
    json_t *origin = json_object_get(json_object_get(doc, "otherData"), "origin_unix_s");
    assert_true(fabs(json_number_value(origin) - T0) < 1e-5);
    json_decref(doc);
    pp_buf_free(&out);
}

/* Without a status the rows are "stage N", one for every index up to the highest seen. */
static void test_rows_without_status(void **state)
{
    (void)state;
    struct fake_trace f;
    fake_trace_init(&f, 1);
    f.sp[0][1].stage = 2; /* a pipeline whose stage 1 took no part */
    struct pp_buf out = {0};
    struct pp_trace_summary sum;
    assert_int_equal(pp_trace_json_write(&f.tr, NULL, &out, &sum), PP_OK);
    json_t *doc = parse(&out);
    assert_int_equal(sum.stages, 3);
    assert_string_equal(row_name(doc, 0), "stage 0");
    assert_string_equal(row_name(doc, 1), "stage 1");
    assert_string_equal(row_name(doc, 2), "stage 2");
    assert_non_null(find(doc, "mb 40 compute", 2));
    json_decref(doc);
    pp_buf_free(&out);
}

/* A span not recorded (start or end 0) is left out; an end before its start (clocks of different
 * hosts) gives dur 0, not a negative. */
static void test_missing_and_skewed(void **state)
{
    (void)state;
    struct fake_trace f;
    fake_trace_init(&f, 1);
    f.sp[0][0].recv_start = 0.0; /* stage 0 got the tokens from the coordinator in its request */
    f.sp[0][0].recv_end = 0.0;
    f.mb[0].delivered = 0.0; /* still in flight */
    f.sp[0][1].compute_end = f.sp[0][1].compute_start - 0.001;
    struct pp_buf out = {0};
    struct pp_trace_summary sum;
    assert_int_equal(pp_trace_json_write(&f.tr, NULL, &out, &sum), PP_OK);
    json_t *doc = parse(&out);
    assert_null(find(doc, "mb 40 recv", 0));
    assert_non_null(find(doc, "mb 40 recv", 1));
    assert_null(find(doc, "mb 40", PP_TRACE_COORDINATOR_TID));
    json_t *e = find(doc, "mb 40 compute", 1);
    assert_non_null(e);
    assert_us(num(e, "dur"), 0.0);
    assert_int_equal(sum.events, 3);
    json_decref(doc);
    pp_buf_free(&out);
}

static void test_empty(void **state)
{
    (void)state;
    Ppserve__V1__TraceResponse tr = PPSERVE__V1__TRACE_RESPONSE__INIT;
    struct pp_buf out = {0};
    struct pp_trace_summary sum;
    assert_int_equal(pp_trace_json_write(&tr, NULL, &out, &sum), PP_OK);
    json_t *doc = parse(&out);
    assert_int_equal(sum.microbatches, 0);
    assert_int_equal(sum.stages, 0);
    assert_int_equal(sum.events, 0);
    assert_true(sum.span_s == 0.0);
    assert_int_equal(count_ph(doc, "X"), 0);
    assert_string_equal(row_name(doc, PP_TRACE_COORDINATOR_TID), "coordinator");
    json_decref(doc);
    /* the buffer is reused: the second document replaces the first */
    struct fake_trace f;
    fake_trace_init(&f, 1);
    assert_int_equal(pp_trace_json_write(&f.tr, NULL, &out, &sum), PP_OK);
    doc = parse(&out);
    assert_int_equal(count_ph(doc, "X"), 5);
    json_decref(doc);
    pp_buf_free(&out);
}

static void test_nomem(void **state)
{
    (void)state;
    struct fake_trace f;
    fake_trace_init(&f, 4);
    struct pp_buf out = {0};
    pp_alloc_fail_at(1);
    pp_status st = pp_trace_json_write(&f.tr, NULL, &out, NULL);
    pp_alloc_fail_at(0);
    assert_int_equal(st, PP_ERR_NOMEM);
    assert_true(out.failed);
    pp_buf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_and_rows),
        cmocka_unit_test(test_rows_without_status),
        cmocka_unit_test(test_missing_and_skewed),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_nomem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
