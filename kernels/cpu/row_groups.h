/* The CPU backend's stored layout for the weights it copies at load (PP_WEIGHT_ROW_GROUPS in
 * kernels/backend.h): rows in groups of PP_ROW_GROUP (the last group holds what is left), and
 * inside a group the rows' units side by side, unit after unit (f32, f16, bf16; Q8_0 below). A
 * unit is 8 elements, one vector step; a row's last unit may be shorter (cols not a multiple of
 * 8). So the few-token matmul, which reads a group's rows together,
 * streams one contiguous run of memory instead of one per row (one stream per thread for the
 * hardware prefetcher, and no restart at every row's end). A group occupies the same bytes as its
 * rows row-major would, at the same place: rows [r, r + g) of the group at row r live in bytes
 * [r · row_bytes, (r + g) · row_bytes). Only addresses change, never the arithmetic.
 *
 * Q8_0 rows are not grouped: the integer kernels (kernels/cpu/matmul_q8.h) read one token's
 * weights four rows at a time, four streams, which on the Zen 4 host ran 27-33 GB/s on one thread
 * against 20-23 for units of three rows' blocks side by side (docs/benchmarks.md). Inside its own
 * bytes a row is split instead: its blocks' f16 scales first (2 · cols / 32 bytes, so eight of them
 * are one load), then its int8 (cols bytes), each stored as the unsigned byte q + 128
 * (q XOR PP_Q8_GROUP_BIAS), the unsigned operand of vpdpbusd as it stands. */
#ifndef PP_CPU_ROW_GROUPS_H
#define PP_CPU_ROW_GROUPS_H

#include <stdint.h>

#include "kernels/dtype.h"

/* Rows per group: the few-token tile's 3 rows and the many-token micro-panel's 3. */
#define PP_ROW_GROUP 3
/* What grouped Q8_0 int8 are XORed with: stored q + 128, unsigned. */
#define PP_Q8_GROUP_BIAS 0x80

/* Elements and stored bytes of one unit. */
static inline int64_t pp__unit_elems(enum pp_dtype dt)
{
    return dt == PP_DTYPE_Q8_0 ? PP_Q8_0_BLOCK : 8;
}

static inline int64_t pp__unit_bytes(enum pp_dtype dt)
{
    return dt == PP_DTYPE_Q8_0 ? PP_Q8_0_BYTES : dt == PP_DTYPE_F32 ? 32 : 16;
}

/* Where a group's row i keeps its units, relative to the group's first byte (grouped = 0 describes
 * plain row-major rows the same way, so one loop serves both): unit u of row i at
 * i · row_off + u · unit_stride; the short last unit at
 * (cols / unit) · unit_stride + i · tail_off. Not for Q8_0 (see above). */
struct pp_row_group {
    int64_t row_off;
    int64_t unit_stride;
    int64_t tail_off;
};

/* The geometry of a group of g rows of a [?, cols] dt weight. */
static inline struct pp_row_group pp__row_group(enum pp_dtype dt, int64_t cols, int grouped,
                                                int64_t g)
{
    int64_t ub = pp__unit_bytes(dt), row_bytes = pp_dtype_row_bytes(dt, cols);
    int64_t rem = cols % pp__unit_elems(dt), esz = dt == PP_DTYPE_F32 ? 4 : 2;
    struct pp_row_group q;
    q.row_off = grouped ? ub : row_bytes;
    q.unit_stride = grouped ? g * ub : ub;
    q.tail_off = grouped ? rem * esz : row_bytes;
    return q;
}

/* Rewrites a row-major [rows, cols] dt weight into the grouped layout (dst and src the same size,
 * not overlapping). */
void pp__row_groups_pack(void *dst, const void *src, enum pp_dtype dt, int64_t rows, int64_t cols);
/* The same for rows [r0, r1) of them only, r0 a multiple of PP_ROW_GROUP and r1 too or rows: the
 * bytes pp__row_groups_pack writes there, so ranges that cover the rows may be packed apart, on
 * different threads. */
void pp__row_groups_pack_range(void *dst, const void *src, enum pp_dtype dt, int64_t rows,
                               int64_t cols, int64_t r0, int64_t r1);

/* Row r of a grouped [rows, cols] dt weight as f32 (exact, as pp_row_to_f32). */
void pp__row_groups_row_to_f32(float *dst, const void *w, enum pp_dtype dt, int64_t rows,
                               int64_t cols, int64_t r);

#endif
