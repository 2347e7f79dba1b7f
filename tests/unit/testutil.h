/* Helpers shared by the unit tests: temporary folders and small synthetic models. */
#ifndef PP_TESTUTIL_H
#define PP_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/synth.h"

/* A fresh folder under $TMPDIR (or /tmp); removed with pp_test_rmdir. */
char *pp_test_tmpdir(void);
void pp_test_rmdir(char *dir);

/* Writes n bytes to path (replacing it), asserting success. */
void pp_test_write_file(const char *path, const void *p, size_t n);

/* A small llama-shaped spec: dim 64, 3 layers, 4 heads, 2 KV heads, ffn 96, vocab 300, ctx 128. */
void pp_test_small_spec(struct pp_synth_spec *s);

/* max|a - ref| / max|ref| of each of rows rows of cols values, the worst row's (the measure
 * of agreement between two engines' logits). */
double pp_test_rel_err(const float *a, const float *ref, int rows, int cols);

/* The first index of the largest of x[n] (greedy sampling). */
int32_t pp_test_argmax(const float *x, int n);

#endif
