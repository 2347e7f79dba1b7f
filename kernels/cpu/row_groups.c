/* The grouped weight layout (kernels/cpu/row_groups.h): writing it, and reading one row back. */
#include "kernels/cpu/row_groups.h"

#include <string.h>

/* Byte offset, from the group's first byte, of unit u of the group's row i (q: the group's
 * geometry; whole: the units of a row before its short last one). */
static int64_t unit_offset(const struct pp_row_group *q, int64_t whole, int64_t i, int64_t u)
{
    if (u < whole)
        return i * q->row_off + u * q->unit_stride;
    return whole * q->unit_stride + i * q->tail_off;
}

/* Rows in the group that holds row r of a matrix of rows rows. */
static int64_t group_rows(int64_t rows, int64_t r)
{
    int64_t g0 = r / PP_ROW_GROUP * PP_ROW_GROUP;
    return rows - g0 < PP_ROW_GROUP ? rows - g0 : PP_ROW_GROUP;
}

/* Q8_0: row i's 34-byte block (scale, then 32 int8) into a group's unit, the int8 biased to
 * unsigned (q XOR 0x80 = q + 128), and back out. */
static void q8_block_put(char *unit, const struct pp_row_group *q, int64_t i, const char *block)
{
    memcpy(unit + pp__q8_scale_at(q, i), block, 2);
    char *dst = unit + pp__q8_step_at(q, i, 0);
    for (int64_t e = 0; e < PP_Q8_0_BLOCK; e++)
        dst[e] = (char)(block[2 + e] ^ PP_Q8_GROUP_BIAS);
}

static void q8_block_get(char *block, const char *unit, const struct pp_row_group *q, int64_t i)
{
    memcpy(block, unit + pp__q8_scale_at(q, i), 2);
    const char *src = unit + pp__q8_step_at(q, i, 0);
    for (int64_t e = 0; e < PP_Q8_0_BLOCK; e++)
        block[2 + e] = (char)(src[e] ^ PP_Q8_GROUP_BIAS);
}

void pp__row_groups_pack(void *dst, const void *src, enum pp_dtype dt, int64_t rows, int64_t cols)
{
    int64_t row_bytes = pp_dtype_row_bytes(dt, cols), ue = pp__unit_elems(dt);
    int64_t ub = pp__unit_bytes(dt), whole = cols / ue, units = (cols + ue - 1) / ue;
    int64_t tail = row_bytes - whole * ub; /* stored bytes of the short last unit, if any */
    for (int64_t g0 = 0; g0 < rows; g0 += PP_ROW_GROUP) {
        int64_t g = group_rows(rows, g0);
        struct pp_row_group q = pp__row_group(dt, cols, 1, g);
        char *gd = (char *)dst + g0 * row_bytes;
        for (int64_t i = 0; i < g; i++) {
            const char *row = (const char *)src + (g0 + i) * row_bytes;
            for (int64_t u = 0; u < units; u++) {
                if (dt == PP_DTYPE_Q8_0)
                    q8_block_put(gd + u * q.unit_stride, &q, i, row + u * ub);
                else
                    memcpy(gd + unit_offset(&q, whole, i, u), row + u * ub,
                           (size_t)(u < whole ? ub : tail));
            }
        }
    }
}

void pp__row_groups_row_to_f32(float *dst, const void *w, enum pp_dtype dt, int64_t rows,
                               int64_t cols, int64_t r)
{
    int64_t row_bytes = pp_dtype_row_bytes(dt, cols), ue = pp__unit_elems(dt), whole = cols / ue;
    int64_t g0 = r / PP_ROW_GROUP * PP_ROW_GROUP;
    struct pp_row_group q = pp__row_group(dt, cols, 1, group_rows(rows, r));
    const char *gd = (const char *)w + g0 * row_bytes;
    for (int64_t k = 0; k < cols; k += ue) {
        int64_t n = cols - k < ue ? cols - k : ue;
        if (dt == PP_DTYPE_Q8_0) {
            char block[PP_Q8_0_BYTES];
            q8_block_get(block, gd + k / ue * q.unit_stride, &q, r - g0);
            pp_row_to_f32(dst + k, block, dt, n);
        } else
            pp_row_to_f32(dst + k, gd + unit_offset(&q, whole, r - g0, k / ue), dt, n);
    }
}
