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

/* Q8_0: a row's 34-byte blocks in their split form (all scales, then all int8 biased), the same
 * row_bytes long. */
static void q8_row_split(char *dst, const char *src, int64_t blocks)
{
    for (int64_t b = 0; b < blocks; b++) {
        const char *blk = src + b * PP_Q8_0_BYTES;
        memcpy(dst + 2 * b, blk, 2);
        for (int64_t e = 0; e < PP_Q8_0_BLOCK; e++)
            dst[2 * blocks + b * PP_Q8_0_BLOCK + e] = (char)(blk[2 + e] ^ PP_Q8_GROUP_BIAS);
    }
}

/* A group's row i, its whole units of ub bytes (16 or 32: a fixed size, so each copy is a move
 * or two, not a call of memcpy) at stride apart. */
static void copy_units(char *dst, const char *row, int64_t whole, int64_t stride, int64_t ub)
{
    if (ub == 16)
        for (int64_t u = 0; u < whole; u++)
            memcpy(dst + u * stride, row + u * 16, 16);
    else
        for (int64_t u = 0; u < whole; u++)
            memcpy(dst + u * stride, row + u * 32, 32);
}

void pp__row_groups_pack_range(void *dst, const void *src, enum pp_dtype dt, int64_t rows,
                               int64_t cols, int64_t r0, int64_t r1)
{
    int64_t row_bytes = pp_dtype_row_bytes(dt, cols), ue = pp__unit_elems(dt);
    int64_t ub = pp__unit_bytes(dt), whole = cols / ue, units = (cols + ue - 1) / ue;
    int64_t tail = row_bytes - whole * ub; /* stored bytes of the short last unit, if any */
    if (dt == PP_DTYPE_Q8_0) {
        for (int64_t r = r0; r < r1; r++)
            q8_row_split((char *)dst + r * row_bytes, (const char *)src + r * row_bytes, whole);
        return;
    }
    for (int64_t g0 = r0; g0 < r1; g0 += PP_ROW_GROUP) {
        int64_t g = group_rows(rows, g0);
        struct pp_row_group q = pp__row_group(dt, cols, 1, g);
        char *gd = (char *)dst + g0 * row_bytes;
        for (int64_t i = 0; i < g; i++) {
            const char *row = (const char *)src + (g0 + i) * row_bytes;
            copy_units(gd + unit_offset(&q, whole, i, 0), row, whole, q.unit_stride, ub);
            if (whole < units)
                memcpy(gd + unit_offset(&q, whole, i, whole), row + whole * ub, (size_t)tail);
        }
    }
}

void pp__row_groups_pack(void *dst, const void *src, enum pp_dtype dt, int64_t rows, int64_t cols)
{
    pp__row_groups_pack_range(dst, src, dt, rows, cols, 0, rows);
}

void pp__row_groups_row_to_f32(float *dst, const void *w, enum pp_dtype dt, int64_t rows,
                               int64_t cols, int64_t r)
{
    int64_t row_bytes = pp_dtype_row_bytes(dt, cols), ue = pp__unit_elems(dt), whole = cols / ue;
    if (dt == PP_DTYPE_Q8_0) {
        char block[PP_Q8_0_BYTES];
        const char *row = (const char *)w + r * row_bytes;
        for (int64_t b = 0; b < whole; b++) {
            memcpy(block, row + 2 * b, 2);
            for (int64_t e = 0; e < PP_Q8_0_BLOCK; e++)
                block[2 + e] = (char)(row[2 * whole + b * PP_Q8_0_BLOCK + e] ^ PP_Q8_GROUP_BIAS);
            pp_row_to_f32(dst + b * PP_Q8_0_BLOCK, block, dt, PP_Q8_0_BLOCK);
        }
        return;
    }
    int64_t g0 = r / PP_ROW_GROUP * PP_ROW_GROUP;
    struct pp_row_group q = pp__row_group(dt, cols, 1, group_rows(rows, r));
    const char *gd = (const char *)w + g0 * row_bytes;
    for (int64_t k = 0; k < cols; k += ue) {
        int64_t n = cols - k < ue ? cols - k : ue;
        pp_row_to_f32(dst + k, gd + unit_offset(&q, whole, r - g0, k / ue), dt, n);
    }
}
