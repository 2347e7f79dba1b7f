/* The vector inner loops give exactly the portable loops' bits, on ragged sizes too. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/simd.h"
#include "testutil.h"

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void test_dot_rows_match(void **state)
{
    (void)state;
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    unsigned seed = 7;
    for (int64_t n = 1; n <= 70; n += 3) {
        for (int64_t nt = 1; nt <= 9; nt++) {
            float *w = malloc(sizeof(float) * (size_t)n);
            float *x = malloc(sizeof(float) * (size_t)(n * nt));
            float y1[9], y2[9];
            for (int64_t i = 0; i < n; i++)
                w[i] = frand(&seed);
            for (int64_t i = 0; i < n * nt; i++)
                x[i] = frand(&seed) * 100.0f;
            fast->dot_rows(y1, w, x, n, n, nt);
            port->dot_rows(y2, w, x, n, n, nt);
            assert_memory_equal(y1, y2, sizeof(float) * (size_t)nt);
            for (int64_t t = 0; t < nt; t++) {
                float d = pp__dot(w, x + t * n, n);
                assert_memory_equal(&y1[t], &d, sizeof(float));
            }
            free(w);
            free(x);
        }
    }
}

static void test_conversions_match(void **state)
{
    (void)state;
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    /* every 16-bit pattern, in a ragged length so the tail path runs too */
    int64_t n = 65536 + 5;
    uint16_t *src = malloc(sizeof(uint16_t) * (size_t)n);
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        src[i] = (uint16_t)i;
    fast->f16_to_f32(a, src, n);
    port->f16_to_f32(b, src, n);
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != a[i]) { /* NaN: both must be NaN; payload bits may differ */
            assert_true(b[i] != b[i]);
            continue;
        }
        assert_memory_equal(&a[i], &b[i], sizeof(float));
    }
    fast->bf16_to_f32(a, src, n);
    port->bf16_to_f32(b, src, n);
    assert_memory_equal(a, b, sizeof(float) * (size_t)n);
    free(src);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_rows_match),
        cmocka_unit_test(test_conversions_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
