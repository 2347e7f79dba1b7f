/* The CPU backend's stored layout for the weights it copies at load (PP_WEIGHT_ROW_GROUPS in
 * kernels/backend.h): rows in groups of PP_ROW_GROUP (the last group holds what is left), and
 * inside a group the rows' units side by side, unit after unit. A unit is 8 elements (f32, f16,
 * bf16: one vector step) or one Q8_0 block of 32; a row's last unit may be shorter (cols not a
 * multiple of 8; never for Q8_0). So the few-token matmul, which reads a group's rows together,
 * streams one contiguous run of memory instead of one per row (one stream per thread for the
 * hardware prefetcher, and no restart at every row's end). A group occupies the same bytes as its
 * rows row-major would, at the same place: rows [r, r + g) of the group at row r live in bytes
 * [r · row_bytes, (r + g) · row_bytes). Only addresses change, never the arithmetic.
 *
 * A Q8_0 group's unit holds its g rows' blocks of one 32-element span: the g f16 scales first (row
 * i's at 2i), then the g rows' 32 int8 one row after the other (row i's at 2g + 32i), each stored
 * as the unsigned byte q + 128 (q XOR PP_Q8_GROUP_BIAS). So a row's block is one 32-byte load, and
 * the unsigned operand of vpdpbusd as it stands (kernels/cpu/matmul_q8.h). */
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
 * (cols / unit) · unit_stride + i · tail_off. A Q8_0 unit is not one row's block (see above): from
 * the unit at u · unit_stride, row i's scale is at i · d_off and its eight int8 of step s at
 * q_base + i · row_off + s · q_step (pp__q8_scale_at, pp__q8_step_at). */
struct pp_row_group {
    int64_t row_off;
    int64_t unit_stride;
    int64_t tail_off;
    int64_t d_off, q_base, q_step; /* Q8_0 only */
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
    q.d_off = q.q_base = q.q_step = 0;
    if (dt == PP_DTYPE_Q8_0) {
        q.row_off = grouped ? PP_Q8_0_BLOCK : row_bytes;
        q.d_off = grouped ? 2 : row_bytes;
        q.q_base = grouped ? 2 * g : 2;
        q.q_step = 8;
    }
    return q;
}

/* Q8_0: the offsets, from a unit's first byte, of row i's scale and of its int8 of step s (s in
 * 0-3). */
static inline int64_t pp__q8_scale_at(const struct pp_row_group *q, int64_t i)
{
    return i * q->d_off;
}

static inline int64_t pp__q8_step_at(const struct pp_row_group *q, int64_t i, int64_t s)
{
    return q->q_base + i * q->row_off + s * q->q_step;
}

/* Rewrites a row-major [rows, cols] dt weight into the grouped layout (dst and src the same size,
 * not overlapping). */
void pp__row_groups_pack(void *dst, const void *src, enum pp_dtype dt, int64_t rows, int64_t cols);

/* Row r of a grouped [rows, cols] dt weight as f32 (exact, as pp_row_to_f32). */
void pp__row_groups_row_to_f32(float *dst, const void *w, enum pp_dtype dt, int64_t rows,
                               int64_t cols, int64_t r);

#endif
