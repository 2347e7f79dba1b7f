/* A tensor as a model file describes it: where its bytes are, its dtype and its shape in numpy
 * order (outermost first; a linear weight is [out, in]). */
#ifndef PP_TENSOR_H
#define PP_TENSOR_H

#include <stdint.h>

#include "kernels/dtype.h"

#define PP_TENSOR_MAX_DIMS 4

struct pp_tensor {
    const void *data; /* inside a mapped file; never owned */
    enum pp_dtype dtype;
    int32_t n_dims;
    int64_t shape[PP_TENSOR_MAX_DIMS];
};

/* Total elements; 1 for a 0-d tensor. */
int64_t pp_tensor_elems(const struct pp_tensor *t);

#endif
