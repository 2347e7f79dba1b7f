/* Small helpers on tensor descriptors. */
#include "model/tensor.h"

int64_t pp_tensor_elems(const struct pp_tensor *t)
{
    int64_t n = 1;
    for (int32_t i = 0; i < t->n_dims; i++)
        n *= t->shape[i];
    return n;
}
