// Weight and vector uploads through pinned staging (weights.cuh). Chunk i is converted into
// staging buffer i % 2 while buffer (i - 1) % 2 is copied to the device; a buffer is rewritten
// only after the event recorded behind its previous copy has fired.
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/weights.cuh"

/* The type a weight of type t has on the device. */
static enum pp_dtype device_dtype(enum pp_dtype t)
{
    return t == PP_DTYPE_F16 ? PP_DTYPE_F16 : PP_DTYPE_BF16;
}

static pp_status stage_upload(struct pp_cuda *c, void *dst, enum pp_dtype dst_t, const void *src,
                              enum pp_dtype src_t, int64_t n)
{
    int64_t elem = dst_t == PP_DTYPE_F32 ? 4 : 2;
    int64_t per = c->stage_bytes / elem;
    per -= per % 32; /* whole Q8_0 blocks */
    for (int64_t first = 0, i = 0; first < n; first += per, i++) {
        int b = (int)(i % 2);
        int64_t cnt = n - first < per ? n - first : per;
        if (c->stage_used[b])
            CUDA_TRY(cudaEventSynchronize(c->stage_done[b]));
        if (pp_convert_range(c->stage[b], dst_t, src, src_t, first, cnt) != 0)
            return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: cannot load %s data as %s (elements "
                            "%lld..%lld)", c->device, pp_dtype_name(src_t), pp_dtype_name(dst_t),
                            (long long)first, (long long)(first + cnt));
        CUDA_TRY(cudaMemcpyAsync((char *)dst + first * elem, c->stage[b], (size_t)(cnt * elem),
                                 cudaMemcpyHostToDevice, c->stream));
        CUDA_TRY(cudaEventRecord(c->stage_done[b], c->stream));
        c->stage_used[b] = 1;
    }
    return PP_OK;
}

/* A resident pointer must be device memory of this backend's device. */
static pp_status check_resident(struct pp_cuda *c, const void *p, const char *what)
{
    cudaPointerAttributes attr;
    CUDA_TRY(cudaPointerGetAttributes(&attr, p));
    if (attr.type != cudaMemoryTypeDevice || attr.device != c->device)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: a resident %s is not in this device's "
                        "memory", c->device, what);
    return PP_OK;
}

/* The backend's sticky error as a status for this thread. */
static pp_status failed(struct pp_cuda *c)
{
    return pp_error(c->err, "%s", c->err_msg);
}

pp_status pp__cuda_weight_load(struct pp_backend *be, const struct pp_weight *w, int resident,
                               struct pp_weight *out)
{
    struct pp_cuda *c = pp__cuda(be);
    *out = *w;
    if (!pp__cuda_enter(c))
        return failed(c);
    if (!w->data || w->rows < 1 || w->cols < 1)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: expected a weight with data and a [rows, "
                        "cols] shape >= 1, got [%lld, %lld]", c->device, (long long)w->rows,
                        (long long)w->cols);
    if (resident) {
        if (w->dtype != PP_DTYPE_F32 && w->dtype != PP_DTYPE_F16 && w->dtype != PP_DTYPE_BF16)
            return pp_error(PP_ERR_UNSUPPORTED, "cuda:%d: a resident weight must be f32, f16 or "
                            "bf16, got %s", c->device, pp_dtype_name(w->dtype));
        return check_resident(c, w->data, "weight");
    }
    if (w->dtype == PP_DTYPE_Q8_0 && w->cols % PP_Q8_0_BLOCK != 0)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: a Q8_0 weight needs a multiple of %d "
                        "columns, got %lld", c->device, PP_Q8_0_BLOCK, (long long)w->cols);
    enum pp_dtype dt = device_dtype(w->dtype);
    void *d = NULL;
    CUDA_TRY(cudaMalloc(&d, (size_t)(w->rows * w->cols * 2)));
    pp_status st = stage_upload(c, d, dt, w->data, w->dtype, w->rows * w->cols);
    if (st != PP_OK) {
        CUDA_OK(c, cudaStreamSynchronize(c->stream)); /* no copy may still target d */
        CUDA_OK(c, cudaFree(d));
        return st;
    }
    out->data = d;
    out->dtype = dt;
    return PP_OK;
}

void pp__cuda_weight_free(struct pp_backend *be, struct pp_weight *w)
{
    struct pp_cuda *c = pp__cuda(be);
    if (w->data && CUDA_OK(c, cudaSetDevice(c->device)))
        CUDA_OK(c, cudaFree((void *)w->data));
    w->data = NULL;
}

pp_status pp__cuda_vec_load(struct pp_backend *be, const float *v, int64_t n, int resident,
                            const float **out)
{
    struct pp_cuda *c = pp__cuda(be);
    *out = v;
    if (!pp__cuda_enter(c))
        return failed(c);
    if (!v || n < 1)
        return pp_error(PP_ERR_INVALID_ARG, "cuda:%d: expected a vector of >= 1 values, got %lld",
                        c->device, (long long)n);
    if (resident)
        return check_resident(c, v, "vector");
    void *d = NULL;
    CUDA_TRY(cudaMalloc(&d, (size_t)n * sizeof(float)));
    pp_status st = stage_upload(c, d, PP_DTYPE_F32, v, PP_DTYPE_F32, n);
    if (st != PP_OK) {
        CUDA_OK(c, cudaStreamSynchronize(c->stream));
        CUDA_OK(c, cudaFree(d));
        return st;
    }
    *out = (const float *)d;
    return PP_OK;
}

void pp__cuda_vec_free(struct pp_backend *be, const float *v)
{
    struct pp_cuda *c = pp__cuda(be);
    if (v && CUDA_OK(c, cudaSetDevice(c->device)))
        CUDA_OK(c, cudaFree((void *)v));
}
