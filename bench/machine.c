/* The machine's limits, measured the same way every run so that the engine's figures can be given
 * as fractions of them: read bandwidth with n threads, and the FP32 FMA peak with n threads. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif
#include <stdio.h>

/* s with its leading and trailing blanks cut off, in place. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n'))
        s[--n] = 0;
    return s;
}

void pp_bench_cpu_name(char *out, size_t n)
{
    snprintf(out, n, "unknown");
#ifdef HAVE_X86
    unsigned r[12], a, b, c, d;
    if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004 &&
        __get_cpuid(0x80000002, &r[0], &r[1], &r[2], &r[3]) &&
        __get_cpuid(0x80000003, &r[4], &r[5], &r[6], &r[7]) &&
        __get_cpuid(0x80000004, &r[8], &r[9], &r[10], &r[11]) &&
        __get_cpuid(1, &a, &b, &c, &d)) {
        char brand[sizeof(r) + 1];
        memcpy(brand, r, sizeof(r));
        brand[sizeof(r)] = 0;
        /* family and model as Linux's /proc/cpuinfo gives them (the extended fields added where
         * the base family says so) */
        unsigned fam = a >> 8 & 0xf, model = a >> 4 & 0xf;
        if (fam == 0xf)
            fam += a >> 20 & 0xff;
        if (fam >= 6)
            model |= (a >> 16 & 0xf) << 4;
        snprintf(out, n, "%s (family %u, model %u)", trim(brand), fam, model);
        return;
    }
#endif
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (colon && strncmp(line, "model name", 10) == 0) {
            snprintf(out, n, "%s", trim(colon + 1));
            break;
        }
    }
    if (f)
        fclose(f);
}

double pp_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define BW_BYTES ((size_t)1 << 30)
#define BW_PASSES 8 /* alternating one and four streams per thread */

/* When one thread of a measurement started and ended its timed part. */
struct span {
    double t0, t1;
};

/* Seconds from the earliest start to the latest end of n threads' spans; the spans lie stride
 * bytes apart (a member of each thread's argument). */
static double wall_seconds(const struct span *first, size_t stride, int n)
{
    double t0 = first->t0, t1 = first->t1;
    for (int i = 1; i < n; i++) {
        const struct span *s = (const struct span *)((const char *)first + (size_t)i * stride);
        if (s->t0 < t0)
            t0 = s->t0;
        if (s->t1 > t1)
            t1 = s->t1;
    }
    return t1 - t0;
}

struct bw_arg {
    const float *p;
    size_t n; /* floats */
    int streams;
    pthread_barrier_t *bar;
    float sink;
    struct span span;
};

#ifdef HAVE_X86
/* One sequential stream, or four (a quarter each, read side by side as the matmul's row tiles
 * do): prefetchers differ in how well they feed each, and the bound is the better one. */
__attribute__((target("avx2"))) static float sum_avx2(const float *p, size_t n, int streams)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    if (streams == 1) {
        for (size_t i = 0; i + 32 <= n; i += 32) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
            a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
            a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
            a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
        }
    } else {
        size_t q = n / 4 / 8 * 8;
        const float *p1 = p + q, *p2 = p1 + q, *p3 = p2 + q;
        for (size_t i = 0; i < q; i += 8) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
            a1 = _mm256_add_ps(a1, _mm256_load_ps(p1 + i));
            a2 = _mm256_add_ps(a2, _mm256_load_ps(p2 + i));
            a3 = _mm256_add_ps(a3, _mm256_load_ps(p3 + i));
        }
    }
    float l[8];
    _mm256_storeu_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
}
#endif

static float sum_plain(const float *p, size_t n)
{
    float a[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            a[j] += p[i + j];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static void *bw_thread(void *arg)
{
    struct bw_arg *a = arg;
    pthread_barrier_wait(a->bar);
    a->span.t0 = pp_bench_now();
#ifdef HAVE_X86
    if (__builtin_cpu_supports("avx2"))
        a->sink = sum_avx2(a->p, a->n, a->streams);
    else
#endif
        a->sink = sum_plain(a->p, a->n);
    a->span.t1 = pp_bench_now();
    return NULL;
}

/* Runs fn on n threads (each waits on a shared barrier before it starts its clock). */
static void run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size)
{
    pthread_t th[64];
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, fn, (char *)args + (size_t)i * arg_size);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

struct pp_bench_bw {
    float *buf;
    size_t n; /* floats */
};

struct pp_bench_bw *pp_bench_bw_new(size_t bytes)
{
    struct pp_bench_bw *b = malloc(sizeof(*b));
    if (!b)
        return NULL;
    b->n = bytes / sizeof(float) / 256 * 256;
    b->buf = aligned_alloc(64, b->n * sizeof(float));
    if (!b->buf) {
        free(b);
        return NULL;
    }
    for (size_t i = 0; i < b->n; i++)
        b->buf[i] = (float)(i & 1023);
    return b;
}

void pp_bench_bw_free(struct pp_bench_bw *b)
{
    if (b) {
        free(b->buf);
        free(b);
    }
}

double pp_bench_bw_pass(struct pp_bench_bw *b, int n_threads, int streams)
{
    if (n_threads > 64)
        n_threads = 64;
    if (n_threads < 1)
        n_threads = 1;
    size_t per = b->n / (size_t)n_threads / 32 * 32;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n_threads);
    struct bw_arg args[64];
    for (int i = 0; i < n_threads; i++)
        args[i] = (struct bw_arg){b->buf + (size_t)i * per, per, streams == 4 ? 4 : 1, &bar, 0,
                                  {0, 0}};
    run_threads(n_threads, bw_thread, args, sizeof(args[0]));
    pthread_barrier_destroy(&bar);
    return (double)(per * (size_t)n_threads * sizeof(float)) /
           wall_seconds(&args[0].span, sizeof(args[0]), n_threads);
}

double pp_bench_read_bandwidth(int n_threads)
{
    struct pp_bench_bw *b = pp_bench_bw_new(BW_BYTES);
    if (!b)
        return 0.0;
    double best = 0.0;
    for (int pass = 0; pass < BW_PASSES; pass++) {
        double bw = pp_bench_bw_pass(b, n_threads, pass % 2 ? 4 : 1);
        if (bw > best)
            best = bw;
    }
    pp_bench_bw_free(b);
    return best;
}

#define FMA_ITERS 30000000L

struct fma_arg {
    pthread_barrier_t *bar;
    float sink;
    struct span span;
};

#ifdef HAVE_X86
/* 12 independent chains of vector type T (FMA f): more than the FMA latency × pipes needs (10 fall
 * short on Zen 3). Distinct starting values: chains that start equal are the same chain, and the
 * compiler keeps one of them (it did: the loop ran one FMA per iteration, latency-bound, and the
 * peak came out 1.5× too high). */
#define FMA_CHAINS(T, set1, fmadd, add)                                                            \
    T m = set1(0.999999f), c = set1(1e-7f);                                                       \
    T r0 = set1(1.00f), r1 = set1(1.01f), r2 = set1(1.02f), r3 = set1(1.03f), r4 = set1(1.04f),   \
      r5 = set1(1.05f), r6 = set1(1.06f), r7 = set1(1.07f), r8 = set1(1.08f), r9 = set1(1.09f),   \
      r10 = set1(1.10f), r11 = set1(1.11f);                                                       \
    pthread_barrier_wait(a->bar);                                                                  \
    a->span.t0 = pp_bench_now();                                                                   \
    for (long i = 0; i < FMA_ITERS; i++) {                                                         \
        r0 = fmadd(r0, m, c);                                                                      \
        r1 = fmadd(r1, m, c);                                                                      \
        r2 = fmadd(r2, m, c);                                                                      \
        r3 = fmadd(r3, m, c);                                                                      \
        r4 = fmadd(r4, m, c);                                                                      \
        r5 = fmadd(r5, m, c);                                                                      \
        r6 = fmadd(r6, m, c);                                                                      \
        r7 = fmadd(r7, m, c);                                                                      \
        r8 = fmadd(r8, m, c);                                                                      \
        r9 = fmadd(r9, m, c);                                                                      \
        r10 = fmadd(r10, m, c);                                                                    \
        r11 = fmadd(r11, m, c);                                                                    \
    }                                                                                              \
    a->span.t1 = pp_bench_now();                                                                   \
    T s = add(add(add(r0, r1), add(r2, r3)), add(add(r4, r5), add(r6, r7)));                      \
    s = add(s, add(add(r8, r9), add(r10, r11)))

__attribute__((target("avx2,fma"))) static void *fma_thread(void *arg)
{
    struct fma_arg *a = arg;
    FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps);
    a->sink = _mm256_cvtss_f32(s);
    return NULL;
}

__attribute__((target("avx512f"))) static void *fma512_thread(void *arg)
{
    struct fma_arg *a = arg;
    FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps);
    a->sink = _mm512_cvtss_f32(s);
    return NULL;
}
#endif

const char *pp_bench_fma_isa(void)
{
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return "avx512";
    if (__builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2"))
        return "avx2";
#endif
    return "none";
}

double pp_bench_fma_peak(int n_threads)
{
#ifdef HAVE_X86
    const char *isa = pp_bench_fma_isa();
    if (strcmp(isa, "none") == 0)
        return 0.0;
    int wide = strcmp(isa, "avx512") == 0;
    if (n_threads > 64)
        n_threads = 64;
    double best = 0.0;
    for (int pass = 0; pass < 3; pass++) {
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)n_threads);
        struct fma_arg args[64];
        for (int i = 0; i < n_threads; i++)
            args[i] = (struct fma_arg){&bar, 0, {0, 0}};
        run_threads(n_threads, wide ? fma512_thread : fma_thread, args, sizeof(args[0]));
        pthread_barrier_destroy(&bar);
        double flops = (double)FMA_ITERS * 12 * (wide ? 16 : 8) * 2 * n_threads /
                       wall_seconds(&args[0].span, sizeof(args[0]), n_threads);
        if (flops > best)
            best = flops;
    }
    return best;
#else
    (void)n_threads;
    return 0.0;
#endif
}
