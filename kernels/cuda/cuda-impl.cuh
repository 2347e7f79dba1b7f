// Internals shared by the CUDA backend's files: the backend's state, the metadata uploader and the
// batch description the attention and KV ops read on the device.
#ifndef PP_CUDA_IMPL_CUH
#define PP_CUDA_IMPL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/check.cuh"

// --- metadata uploads ------------------------------------------------------------------------
// Small host metadata (token ids, positions, sequence tables, work lists) reaches the device
// through rings of pinned staging buffers, one ring per kind: an upload whose bytes equal the
// ring's newest upload returns that device copy again (a layer's ops see the same positions and
// tables), any other takes the next entry once its previous copy has finished reading it.
enum pp_cuda_slot {
    PP_CUDA_SLOT_IDS = 0, // embed: token ids
    PP_CUDA_SLOT_POS,     // rope: positions
    PP_CUDA_SLOT_BATCH,   // kv_store, attention: the batch description below
    PP_CUDA_SLOT_PLAN,    // attention: work lists for one head shape
    PP_CUDA_SLOT_ROWS,    // gather/scatter rows: indices and weights (many per forward)
    PP_CUDA_SLOT_COUNT
};

#define PP_CUDA_RING_MAX 64

struct pp_cuda_ring_entry {
    void *host;       // pinned, cap bytes: the bytes last uploaded from this entry
    void *dev;        // cap bytes
    int64_t cap;
    int64_t bytes;    // of the last upload
    cudaEvent_t done; // recorded after the copy: the host buffer may be rewritten once it fired
    int used;
};

struct pp_cuda_ring {
    int n;      // entries in use
    int next;   // the entry the next new content takes
    int newest; // the entry holding the newest content, -1 before the first upload
    struct pp_cuda_ring_entry e[PP_CUDA_RING_MAX];
};

// --- the batch as the device sees it ------------------------------------------------------------
struct pp_cuda_seq {
    int32_t row;      // first batch row
    int32_t n_tokens;
    int32_t pos;      // position of the first row
    int32_t bt_off;   // offset of its block table in bt
};

// Device pointers into one uploaded blob (all NULL when the upload failed), plus the host facts
// the launchers plan with.
struct pp_cuda_batch {
    int32_t n_seqs;
    int32_t n_rows;
    int32_t max_len;              // longest pos + n_tokens
    const int64_t *row_base;      // [n_rows] element offset of the row's K in layer 0
    const struct pp_cuda_seq *seqs; // [n_seqs]
    const int32_t *bt;            // block tables, concatenated
    const int32_t *row_seq;       // [n_rows] the sequence of each row
    const int32_t *row_pos;       // [n_rows] the position of each row
};

// --- the backend ------------------------------------------------------------------------------
struct pp_cuda {
    int device;
    int sm_count;
    int smem_optin;         // largest dynamic shared memory a block may opt into
    cudaStream_t stream;
    cublasHandle_t cublas;
    pp_status err;          // the first error (sticky); PP_OK while healthy
    char err_msg[768];
    // workspace: one device allocation from the byte budget, cuBLAS's part first, then scratch
    // that one op at a time uses (ops are ordered on the stream)
    void *ws;
    int64_t ws_bytes;
    void *scratch;
    int64_t scratch_bytes;
    int64_t max_cols;       // as reserved
    int64_t max_context;
    // weight uploads: two pinned staging buffers used in turn
    void *stage[2];
    cudaEvent_t stage_done[2];
    int stage_used[2];
    int64_t stage_bytes;
    struct pp_cuda_ring rings[PP_CUDA_SLOT_COUNT];
    // host staging of metadata blobs before upload (grown as needed)
    void *blob;
    int64_t blob_cap;
    int attn_configured;    // the attention kernels' shared-memory limits are set
};

static inline struct pp_cuda *pp__cuda(struct pp_backend *be)
{
    return (struct pp_cuda *)be->impl;
}

// Selects the backend's device on the calling thread and says whether ops may run (no error yet).
int pp__cuda_enter(struct pp_cuda *c);

// Device copy of bytes of src via the slot's ring; NULL after recording an error.
const void *pp__cuda_upload(struct pp_cuda *c, enum pp_cuda_slot slot, const void *src,
                            int64_t bytes);
// A host buffer of at least bytes for building a blob (valid until the next call); NULL on error.
void *pp__cuda_blob(struct pp_cuda *c, int64_t bytes);
pp_status pp__cuda_rings_init(struct pp_cuda *c);
void pp__cuda_rings_free(struct pp_cuda *c);

// The batch of seqs over cache geometry kv, uploaded (once per distinct content). Returns 0 after
// recording an error.
int pp__cuda_batch(struct pp_cuda *c, const struct pp_kv_view *kv, const struct pp_attn_seq *seqs,
                   int32_t n_seqs, struct pp_cuda_batch *out);

// Threads per block of the simple element-wise kernels, and a grid covering n items with it.
#define PP_CUDA_THREADS 256
static inline unsigned pp__cuda_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 2147483647 ? 2147483647 : b);
}

#endif
