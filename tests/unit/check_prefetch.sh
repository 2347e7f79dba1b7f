#!/usr/bin/env bash
# The matmul nests' software prefetches change no result, so only this notices when they go:
# - the many-token nest asks for the next panel's weights while it sweeps the current one
#   (panel_src_prefetch in kernels/cpu/simd_avx2.c, an L2 prefetch). GCC 12 once deleted every
#   call to that helper, taking a function whose only effects are prefetches for one without side
#   effects;
# - the few-token tiles prefetch the weights they stream into L1 or L2, as the backend chose
#   (pp_simd_prefetch_l2, dtile_prefetch in kernels/cpu/simd_x86_direct.h): both forms must be in
#   the one-token f16 tile; the four-group one-token tile (zquad_f16_1) prefetches its 12 rows'
#   lines three times (into L1, into L2, and into L1 nearer beside the L2 one:
#   PP_MM_GROUPED_PF_NEAR_L1), so it must hold 24 prefetcht0;
# - the Q8_0 integer tiles prefetch the next tile's int8 and scales the same two ways
#   (q8_prefetch in kernels/cpu/matmul_q8_x86.h; q8_tile_one_1, the one-token tile over the
#   backend's copy, is built by both the AVX2 and the VNNI file); and the VNNI pair tiles on
#   adjacent rows, whose next rows q8z_rows asks for into L2 a share before each token tile;
# - attention's first queries ask for the keys and values of the rows ahead
#   (PP_ATTN_KEYS_AHEAD, PP_ATTN_VALUES_AHEAD in kernels/cpu/simd.h): a line of each of the
#   AVX-512 key tile's 8 rows, each of the 4 vectors of a 64-element value row, a line of each of
#   the AVX2 key tile's 4 rows.
# This reads the built machine code and fails unless it holds them.
# Usage: check_prefetch.sh OBJDUMP LIBPP_KERNELS_A
set -euo pipefail
objdump=$1
lib=$2
# awk reads to the end (no early exit), so that objdump never dies of a closed pipe
dump=$("$objdump" -d --no-show-raw-insn "$lib")
body() {
    awk -v fn="$1" '$0 ~ "^[0-9a-f]+ <" fn ">:$" {on = 1; next} on && /^$/ {on = 0} on {print}' \
        <<<"$dump"
}
# function, instruction, how many at least, what is lost with fewer
check_count() {
    local code n
    code=$(body "$1")
    if [ -z "$code" ]; then
        echo "check_prefetch: no $1 in $lib" >&2
        exit 1
    fi
    n=$(grep -c "$2" <<<"$code" || true)
    if [ "$n" -lt "$3" ]; then
        echo "check_prefetch: $1 in $lib issues $n $2, expected at least $3:" \
            "$4 was compiled away" >&2
        exit 1
    fi
    echo "check_prefetch: $1 holds $n $2 ($4)"
}
# function, instruction, what is lost without it
check() {
    check_count "$1" "$2" 1 "$3"
}
check pp__mm_packed_avx2 prefetcht1 "the next panel's prefetch"
check dtile_f16_6x1 prefetcht0 "the few-token prefetch into L1"
check dtile_f16_6x1 prefetcht1 "the few-token prefetch into L2"
check q8_tile_one_1 prefetcht0 "the Q8_0 one-token prefetch into L1"
check q8_tile_one_1 prefetcht1 "the Q8_0 one-token prefetch into L2"
check_count zquad_f16_1 prefetcht0 24 "the near L1 prefetch beside the L2 one"
check q8z_rows prefetcht1 "the Q8_0 pair tiles' prefetch of the next rows into L2"
check_count dots_avx512 prefetcht0 8 "attention's keys ahead (AVX-512)"
check_count zwsum_4_4 prefetcht0 4 "attention's values ahead (AVX-512)"
check_count dots_avx2 prefetcht0 4 "attention's keys ahead (AVX2)"
check wsum_avx2 prefetcht0 "attention's values ahead (AVX2)"
