/* Helpers shared by the unit tests: temporary folders and small synthetic models. */
#ifndef PP_TESTUTIL_H
#define PP_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/executor.h"
#include "model/model.h"
#include "model/synth.h"

/* A fresh folder under $TMPDIR (or /tmp); removed with pp_test_rmdir. */
char *pp_test_tmpdir(void);
void pp_test_rmdir(char *dir);

/* Group fixtures for tests that need one fresh folder, pp_test_dir, while the group runs. */
extern char *pp_test_dir;
int pp_test_dir_setup(void **state);
int pp_test_dir_teardown(void **state);

/* Writes n bytes to path (replacing it), asserting success. */
void pp_test_write_file(const char *path, const void *p, size_t n);

/* A small llama-shaped spec: dim 64, 3 layers, 4 heads, 2 KV heads, ffn 96, vocab 300, ctx 128. */
void pp_test_small_spec(struct pp_synth_spec *s);

/* pp_test_small_spec as arch ("mixtral" or "qwen2moe") with n experts, k used per token. */
void pp_test_moe_spec(struct pp_synth_spec *s, const char *arch, int32_t n, int32_t k);

/* A model range, its CPU worker backends and an executor over them, as the executor tests use it:
 * tp workers (1 = the plain executor) in ep expert groups (0 = 1) sharing threads threads, windows
 * of window rows, room for 8 sequences. Fails the test with the error's detail when a part cannot
 * be built. */
struct pp_test_engine {
    struct pp_model *m;
    struct pp_backend *bes[64];
    int32_t tp;
    struct pp_executor *ex;
};

void pp_test_engine_open(struct pp_test_engine *e, const char *path, int32_t first, int32_t last,
                         int32_t tp, int32_t ep, int threads, int32_t window);
void pp_test_engine_close(struct pp_test_engine *e);

/* max|a - ref| / max|ref| of each of rows rows of cols values, the worst row's (the measure
 * of agreement between two engines' logits). */
double pp_test_rel_err(const float *a, const float *ref, int rows, int cols);

/* The first index of the largest of x[n] (greedy sampling). */
int32_t pp_test_argmax(const float *x, int n);

#endif
