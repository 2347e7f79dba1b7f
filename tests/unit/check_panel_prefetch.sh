#!/usr/bin/env bash
# The many-token matmul nest asks for the next panel's weights while it sweeps the current one
# (panel_src_prefetch in kernels/cpu/simd_avx2.c, an L2 prefetch). GCC 12 once deleted every call
# to that helper, taking a function whose only effects are prefetches for one without side
# effects, and nothing else noticed: the results stay the same, only prefill slows down. This
# reads the built nest's machine code and fails unless it holds the prefetch.
# Usage: check_panel_prefetch.sh OBJDUMP LIBPP_KERNELS_A
set -euo pipefail
objdump=$1
lib=$2
# awk reads to the end (no early exit), so that objdump never dies of a closed pipe
code=$("$objdump" -d --no-show-raw-insn "$lib" |
    awk '/^[0-9a-f]+ <pp__mm_packed_avx2>:$/ {on = 1; next} on && /^$/ {on = 0} on {print}')
if [ -z "$code" ]; then
    echo "check_panel_prefetch: no pp__mm_packed_avx2 in $lib" >&2
    exit 1
fi
if ! grep -q 'prefetcht1' <<<"$code"; then
    echo "check_panel_prefetch: pp__mm_packed_avx2 in $lib issues no prefetcht1:" \
         "the next panel's prefetch was compiled away" >&2
    exit 1
fi
echo "check_panel_prefetch: pp__mm_packed_avx2 prefetches the next panel" \
     "($(grep -c 'prefetcht1' <<<"$code") prefetcht1)"
