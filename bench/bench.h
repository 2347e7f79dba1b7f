/* Shared pieces of pp_bench (bench/bench_cpu.c): the machine's own limits, measured in the same
 * run, and the f32 matmul comparison with OpenBLAS. */
#ifndef PP_BENCH_H
#define PP_BENCH_H

#include <stdint.h>

#include "kernels/backend.h"

/* Seconds on the monotonic clock. */
double pp_bench_now(void);

/* The 1-minute load average (how busy the shared machine was), -1 when unknown. */
double pp_bench_loadavg(void);
/* Writes the finished JSON text of j and a newline to path (replacing the file). On failure
 * (j incomplete for lack of memory, or the file cannot be opened, written or closed) prints
 * "who: cannot write path: why" and returns -1; else 0. */
struct pp_json;
int pp_bench_write_json(const char *path, const char *who, const struct pp_json *j);

/* Writes "key": [a, b] into j: a figure measured twice, before and after (a bound, the load
 * average). */
void pp_bench_json_pair(struct pp_json *j, const char *key, double a, double b);
/* qsort comparator of doubles, increasing. */
int pp_bench_cmp_double(const void *a, const void *b);
/* The first index of the largest of v[n]. */
int pp_bench_argmax(const float *v, int n);

/* Best of several passes of n_threads threads each summing its share of a 1 GiB buffer with AVX2
 * loads, in one stream or four per thread (or plain C without AVX2): bytes read per second. */
double pp_bench_read_bandwidth(int n_threads);

/* A buffer for single bandwidth passes taken between other measurements (pp_bench's decode steps
 * beside the bandwidth): bytes of floats, written once; NULL when it cannot be had. */
struct pp_bench_bw;
struct pp_bench_bw *pp_bench_bw_new(size_t bytes);
void pp_bench_bw_free(struct pp_bench_bw *b);
/* One pass of n_threads threads over the buffer, each summing its share in one stream or four
 * (streams 1 or 4): bytes read per second. */
double pp_bench_bw_pass(struct pp_bench_bw *b, int n_threads, int streams);

/* Best of several runs of n_threads threads each issuing 12 independent chains of FMAs of the
 * widest vectors the CPU has (pp_bench_fma_isa: 16 floats with AVX-512, else 8 with AVX2): FP32
 * FLOP per second (an FMA counts 2). 0 when the CPU has no FMA. */
double pp_bench_fma_peak(int n_threads);
/* The CPU's name for a bench's header and JSON ("cpu"): its brand string with family and model on
 * x86 ("AMD EPYC (family 25, model 1)"), else /proc/cpuinfo's model name, else "unknown". The
 * hosts differ from run to run, so figures are compared only where it is the same. */
void pp_bench_cpu_name(char *out, size_t n);
/* "avx512", "avx2" or "none": the vectors pp_bench_fma_peak measures. */
const char *pp_bench_fma_isa(void);

/* One matmul shape of the comparison: [rows, cols] weights times n tokens. */
struct pp_bench_shape {
    const char *name;
    int64_t rows, cols;
};

/* Seconds per call (best of reps) on random f32 weights of the given shape: of be's matmul when
 * be is not NULL, else of cblas_sgemm with n_threads threads (0 when the build has no OpenBLAS).
 * Time every shape of one before the other: OpenBLAS's threads keep spinning after a call. */
double pp_bench_matmul_time(struct pp_backend *be, int n_threads, const struct pp_bench_shape *s,
                            int64_t n);
/* 1 when this build links OpenBLAS (pkg-config found openblas when it was configured), else 0. */
int pp_bench_have_openblas(void);

#endif
