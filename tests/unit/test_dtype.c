/* Unit tests of kernels/dtype: the f16/bf16/Q8_0 conversions every backend and the numpy reference
 * must agree on bit for bit. The f16 decoder is checked against an independent formula for all
 * 65536 patterns, and the encoders' rounding is checked at every tie between neighbouring values.
 */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE binary16 decoded straight from the definition, in double. */
static double f16_ref(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -24);
    else
        v = ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

static int f16_is_nan(uint16_t h)
{
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

static void test_names_and_row_bytes(void **state)
{
    (void)state;
    for (int t = 0; t < PP_DTYPE_COUNT; t++)
        assert_int_equal(pp_dtype_parse(pp_dtype_name((enum pp_dtype)t)), t);
    assert_string_equal(pp_dtype_name(PP_DTYPE_Q8_0), "q8_0");
    assert_string_equal(pp_dtype_name(PP_DTYPE_COUNT), "unknown");
    assert_int_equal(pp_dtype_parse("q4_0"), -1);
    assert_int_equal(pp_dtype_parse("F32"), -1); /* names are lower case */
    assert_int_equal(pp_dtype_parse(""), -1);

    assert_int_equal(pp_dtype_row_bytes(PP_DTYPE_F32, 7), 28);
    assert_int_equal(pp_dtype_row_bytes(PP_DTYPE_F16, 7), 14);
    assert_int_equal(pp_dtype_row_bytes(PP_DTYPE_BF16, 4096), 8192);
    assert_int_equal(pp_dtype_row_bytes(PP_DTYPE_Q8_0, 32), 34);
    assert_int_equal(pp_dtype_row_bytes(PP_DTYPE_Q8_0, 4096), 128 * 34);
    assert_int_equal(pp_dtype_row_bytes(PP_DTYPE_Q8_0, 33), -1);
    assert_int_equal(pp_dtype_row_bytes(PP_DTYPE_Q8_0, 0), 0);
    assert_int_equal(pp_dtype_row_bytes(PP_DTYPE_COUNT, 32), -1);
    /* 64-bit sizes: a row past 2^31 bytes does not wrap */
    assert_true(pp_dtype_row_bytes(PP_DTYPE_F32, (int64_t)1 << 31) == (int64_t)1 << 33);
}

static void test_f16_known_values(void **state)
{
    (void)state;
    assert_true(pp_f16_to_f32(0x3c00) == 1.0f);
    assert_true(pp_f16_to_f32(0xc000) == -2.0f);
    assert_true(pp_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(pp_f16_to_f32(0x0400) == ldexpf(1.0f, -14)); /* smallest normal */
    assert_true(pp_f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    assert_true(pp_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    assert_true(pp_f16_to_f32(0x7c00) == INFINITY);
    assert_true(pp_f16_to_f32(0xfc00) == -INFINITY);
    assert_true(isnan(pp_f16_to_f32(0x7e00)));
    float nz = pp_f16_to_f32(0x8000);
    assert_true(nz == 0.0f && signbit(nz));

    assert_int_equal(pp_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(pp_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(pp_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(pp_f32_to_f16(1e10f), 0x7c00);   /* overflow to infinity */
    assert_int_equal(pp_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(pp_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(pp_f32_to_f16(1e-10f), 0x0000);  /* underflow to zero */
    assert_int_equal(pp_f32_to_f16(-1e-10f), 0x8000); /* keeps the sign */
    assert_int_equal(pp_f32_to_f16(FLT_TRUE_MIN), 0x0000);
    assert_true(f16_is_nan(pp_f32_to_f16(NAN)));
    assert_true(f16_is_nan(pp_f32_to_f16(-NAN)));
}

/* All 65536 patterns: decoding matches the definition exactly, and encoding gives the pattern back
 * (NaNs come back as a NaN with the same sign: their payload is canonicalised). */
static void test_f16_exhaustive_round_trip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = pp_f16_to_f32((uint16_t)h);
        uint16_t back = pp_f32_to_f16(f);
        if (f16_is_nan((uint16_t)h)) {
            assert_true(isnan(f));
            assert_true(f16_is_nan(back));
            assert_int_equal(back & 0x8000, h & 0x8000);
            continue;
        }
        double ref = f16_ref((uint16_t)h);
        if ((double)f != ref || !signbit(f) != !signbit(ref))
            fail_msg("f16 0x%04x decodes to %a, expected %a", h, (double)f, ref);
        if (back != h)
            fail_msg("f16 0x%04x -> %a -> 0x%04x", h, (double)f, back);
    }
}

/* Round to nearest even at every tie: for each pair of neighbouring f16 values (subnormals, the
 * subnormal/normal boundary and the top of the range included), the exact midpoint goes to the one
 * with an even mantissa, and one f32 ulp either side goes to the nearer one. */
static void test_f16_rounding_ties(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float a = pp_f16_to_f32((uint16_t)h), b = pp_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2); /* exact: needs one bit more than f16 */
        assert_true((double)mid == ((double)a + (double)b) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (pp_f32_to_f16(mid) != even)
            fail_msg("tie %a between 0x%04x and 0x%04x gave 0x%04x", (double)mid, h, h + 1,
                     pp_f32_to_f16(mid));
        assert_int_equal(pp_f32_to_f16(nextafterf(mid, 0.0f)), h);
        assert_int_equal(pp_f32_to_f16(nextafterf(mid, INFINITY)), h + 1);
        /* negative values mirror */
        assert_int_equal(pp_f32_to_f16(-mid), even | 0x8000);
    }
    /* above 65504 the next value would be 65536 (odd mantissa): the tie 65520 overflows */
    assert_int_equal(pp_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(pp_f32_to_f16(nextafterf(65520.0f, 0.0f)), 0x7bff);
    /* the named classic cases */
    assert_int_equal(pp_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);     /* tie down to even */
    assert_int_equal(pp_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02); /* tie up to even */
    assert_int_equal(pp_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* half the min subnormal */
    assert_int_equal(pp_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);
    assert_int_equal(pp_f32_to_f16(ldexpf(2047.0f, -25)),
                     0x0400); /* largest subnormal + half ulp */
}

static int bf16_is_nan(uint16_t h)
{
    return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

static void test_bf16_exhaustive_round_trip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = pp_bf16_to_f32((uint16_t)h);
        /* bf16 is the top half of an f32 */
        assert_int_equal(f32_bits(f), h << 16);
        uint16_t back = pp_f32_to_bf16(f);
        if (bf16_is_nan((uint16_t)h)) {
            assert_true(bf16_is_nan(back)); /* a NaN must not round into infinity */
            assert_int_equal(back & 0x8000, h & 0x8000);
        } else {
            assert_int_equal(back, h);
        }
    }
    /* a NaN whose payload sits only in the low 16 bits would truncate to infinity: it must not */
    assert_true(bf16_is_nan(pp_f32_to_bf16(f32_from_bits(0x7f800001u))));
    assert_true(bf16_is_nan(pp_f32_to_bf16(f32_from_bits(0xff800001u))));
}

static void test_bf16_rounding_ties(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x7f7f; h++) {
        /* the tie between h and h+1 is the f32 with low half 0x8000 */
        float mid = f32_from_bits((h << 16) | 0x8000u);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (pp_f32_to_bf16(mid) != even)
            fail_msg("bf16 tie above 0x%04x gave 0x%04x", h, pp_f32_to_bf16(mid));
        assert_int_equal(pp_f32_to_bf16(f32_from_bits((h << 16) | 0x7fffu)), h);
        assert_int_equal(pp_f32_to_bf16(f32_from_bits((h << 16) | 0x8001u)), h + 1);
        assert_int_equal(pp_f32_to_bf16(-mid), even | 0x8000);
    }
    assert_int_equal(pp_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
    assert_int_equal(pp_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82);
    assert_int_equal(pp_f32_to_bf16(FLT_MAX), 0x7f80); /* rounds past the largest bf16 */
    assert_int_equal(pp_f32_to_bf16(-INFINITY), 0xff80);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_float(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next(s) >> 40) * (1.0 / 16777216.0));
}

/* Q8_0: each block stores d = max|x|/127 as f16 and q = round(x/d) in [-127, 127]; dequantized
 * values are then within half a step of the input. When d itself rounds down (it is an f16, and a
 * subnormal one for blocks below ~8e-3), the largest elements clamp at 127 and may miss by up to
 * max|x| - 127·d more. */
static void test_q8_0_error_bound(void **state)
{
    (void)state;
    uint64_t seed = 7;
    enum { N = 32 * 6 };
    const float scales[] = {1.0f, 0.05f, 50.0f, 1000.0f, 1e-3f, 3e-6f};
    for (int si = 0; si < 6; si++) {
        float x[N], y[N];
        uint8_t q[N / 32 * PP_Q8_0_BYTES];
        for (int i = 0; i < N; i++)
            x[i] = rng_float(&seed, -1.0f, 1.0f) * scales[si] * (float)(1 + i / 32);
        x[5] = 0.0f;
        pp_quantize_q8_0(q, x, N);
        pp_row_to_f32(y, q, PP_DTYPE_Q8_0, N);
        for (int b = 0; b < N / 32; b++) {
            const uint8_t *blk = q + b * PP_Q8_0_BYTES;
            uint16_t dh;
            memcpy(&dh, blk, 2);
            float d = pp_f16_to_f32(dh);
            float amax = 0.0f;
            int qmax = 0;
            for (int i = 0; i < 32; i++) {
                amax = fmaxf(amax, fabsf(x[b * 32 + i]));
                int qi = (int8_t)blk[2 + i];
                assert_in_range(qi + 127, 0, 254);
                if (abs(qi) > qmax)
                    qmax = abs(qi);
                /* the layout: value = d * q, exactly */
                assert_true(y[b * 32 + i] == d * (float)qi);
            }
            /* d is amax/127 rounded to the nearest f16 */
            assert_int_equal(dh, pp_f32_to_f16(amax / 127.0f));
            if (dh >= 0x0400)
                assert_int_equal(qmax,
                                 127); /* a normal d: the largest element uses the full range */
            float bound = 0.5f * d * 1.001f + fmaxf(0.0f, amax - 127.0f * d);
            for (int i = 0; i < 32; i++) {
                float err = fabsf(x[b * 32 + i] - y[b * 32 + i]);
                if (err > bound)
                    fail_msg("scale %g block %d elem %d: x=%g y=%g d=%g", (double)scales[si], b,
                             i, (double)x[b * 32 + i], (double)y[b * 32 + i], (double)d);
            }
            /* and for normal d that extra clamp term is tiny: the error stays near half a step */
            if (dh >= 0x0400)
                assert_true(bound <= 0.5f * d * 1.001f + d * 0.07f);
        }
    }
}

static void test_q8_0_zero_block(void **state)
{
    (void)state;
    float x[32] = {0}, y[32];
    uint8_t q[PP_Q8_0_BYTES];
    memset(q, 0xaa, sizeof(q));
    pp_quantize_q8_0(q, x, 32);
    for (int i = 0; i < PP_Q8_0_BYTES; i++)
        assert_int_equal(q[i], 0); /* scale 0, all q 0: no NaN from 0/0 */
    pp_row_to_f32(y, q, PP_DTYPE_Q8_0, 32);
    for (int i = 0; i < 32; i++)
        assert_true(y[i] == 0.0f);
}

/* pp_row_to_f32 agrees element by element with the scalar converters. */
static void test_row_to_f32(void **state)
{
    (void)state;
    uint64_t seed = 3;
    enum { N = 37 };
    float src[N], out[N];
    uint16_t h[N], b[N];
    for (int i = 0; i < N; i++) {
        src[i] = rng_float(&seed, -100.0f, 100.0f);
        h[i] = pp_f32_to_f16(src[i]);
        b[i] = pp_f32_to_bf16(src[i]);
    }
    pp_row_to_f32(out, src, PP_DTYPE_F32, N);
    assert_memory_equal(out, src, sizeof(src));
    pp_row_to_f32(out, h, PP_DTYPE_F16, N);
    for (int i = 0; i < N; i++)
        assert_true(out[i] == pp_f16_to_f32(h[i]));
    pp_row_to_f32(out, b, PP_DTYPE_BF16, N);
    for (int i = 0; i < N; i++)
        assert_true(out[i] == pp_bf16_to_f32(b[i]));
}

/* Loading onto a device: ranges of a tensor as 16-bit or f32, f32 and Q8_0 rounded to bf16. */
static void test_convert_range(void **state)
{
    (void)state;
    enum { N = 96 };
    float f[N];
    uint16_t h[N], b[N], out[N];
    for (int i = 0; i < N; i++) {
        f[i] = (float)(i - 40) * 0.37f + (i % 3 ? 1e-3f : 0.0f);
        h[i] = pp_f32_to_f16(f[i]);
        b[i] = pp_f32_to_bf16(f[i]);
    }
    /* the same type: a plain copy of [first, first + n) */
    assert_int_equal(pp_convert_range(out, PP_DTYPE_F16, h, PP_DTYPE_F16, 5, 20), 0);
    assert_memory_equal(out, h + 5, 20 * sizeof(uint16_t));
    assert_int_equal(pp_convert_range(out, PP_DTYPE_BF16, b, PP_DTYPE_BF16, 0, N), 0);
    assert_memory_equal(out, b, sizeof(b));
    float fo[N];
    assert_int_equal(pp_convert_range(fo, PP_DTYPE_F32, f, PP_DTYPE_F32, 3, 7), 0);
    assert_memory_equal(fo, f + 3, 7 * sizeof(float));
    /* f32 to bf16: round to nearest even, element by element */
    assert_int_equal(pp_convert_range(out, PP_DTYPE_BF16, f, PP_DTYPE_F32, 11, 50), 0);
    assert_memory_equal(out, b + 11, 50 * sizeof(uint16_t));
    /* Q8_0 to bf16: the exact Q8_0 values, rounded once; whole blocks only */
    uint8_t q[3 * PP_Q8_0_BYTES];
    pp_quantize_q8_0(q, f, N);
    float deq[N];
    pp_row_to_f32(deq, q, PP_DTYPE_Q8_0, N);
    assert_int_equal(pp_convert_range(out, PP_DTYPE_BF16, q, PP_DTYPE_Q8_0, 32, 64), 0);
    for (int i = 0; i < 64; i++)
        assert_int_equal(out[i], pp_f32_to_bf16(deq[32 + i]));
    assert_int_equal(pp_convert_range(out, PP_DTYPE_BF16, q, PP_DTYPE_Q8_0, 16, 32), -1);
    assert_int_equal(pp_convert_range(out, PP_DTYPE_BF16, q, PP_DTYPE_Q8_0, 0, 40), -1);
    /* pairs a device never needs */
    assert_int_equal(pp_convert_range(out, PP_DTYPE_F16, f, PP_DTYPE_F32, 0, 4), -1);
    assert_int_equal(pp_convert_range(out, PP_DTYPE_BF16, h, PP_DTYPE_F16, 0, 4), -1);
    assert_int_equal(pp_convert_range(out, PP_DTYPE_Q8_0, q, PP_DTYPE_Q8_0, 0, 32), -1);
    assert_int_equal(pp_convert_range(out, PP_DTYPE_BF16, f, PP_DTYPE_F32, -1, 4), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_row_bytes),
        cmocka_unit_test(test_f16_known_values),
        cmocka_unit_test(test_f16_exhaustive_round_trip),
        cmocka_unit_test(test_f16_rounding_ties),
        cmocka_unit_test(test_bf16_exhaustive_round_trip),
        cmocka_unit_test(test_bf16_rounding_ties),
        cmocka_unit_test(test_q8_0_error_bound),
        cmocka_unit_test(test_q8_0_zero_block),
        cmocka_unit_test(test_row_to_f32),
        cmocka_unit_test(test_convert_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
