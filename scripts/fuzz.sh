#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz with clang (ASan+UBSan) and runs each for SECONDS
# (default 60), seeded with small synthetic models. Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf safetensors tokenizer)
out=$PWD/build-fuzz
mkdir -p "$out"
# the loaders need no compute kernels
sources=($(ls common/*.c | grep -v config.c) kernels/dtype.c model/*.c)
flags=(-std=c11 -D_GNU_SOURCE -DPP_HAVE_JANSSON -DPP_HAVE_PCRE2 -I. -g -O1 -ffp-contract=off
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
[ -x build/ppserve ] || bash scripts/build.sh
for t in "${targets[@]}"; do
    clang "${flags[@]}" -o "$out/fuzz_$t" "tests/fuzz/fuzz_$t.c" "${sources[@]}" \
        $(pkg-config --cflags --libs jansson libpcre2-8) -lm -lpthread
    corpus="$out/corpus_$t"
    mkdir -p "$corpus"
    if [ -z "$(ls -A "$corpus")" ]; then
        ./build/ppserve synth --out "$out/seed" --shape tiny --format both --ctx 64 >/dev/null
        ./build/ppserve synth --out "$out/seed-bpe" --shape tiny --tokenizer bpe --vocab 400 \
            --ctx 64 >/dev/null
        # a one-layer Mixtral and Qwen2-MoE: 3-D expert tensors, router, shared expert
        ./build/ppserve synth --out "$out/seed-moe" --shape tiny-moe --layers 1 --ctx 64 >/dev/null
        ./build/ppserve synth --out "$out/seed-qmoe" --shape tiny-moe --arch qwen2moe --layers 1 \
            --expert-ffn 32 --shared-ffn 32 --dtype q8_0 --ctx 64 >/dev/null
        case $t in
            gguf) cp "$out/seed/model.gguf" "$corpus/tiny.gguf"
                  cp "$out/seed-bpe/model.gguf" "$corpus/tiny-bpe.gguf"
                  cp "$out/seed-moe/model.gguf" "$corpus/tiny-moe.gguf"
                  cp "$out/seed-qmoe/model.gguf" "$corpus/tiny-qwen2moe.gguf" ;;
            safetensors) cp "$out/seed/hf/model.safetensors" "$corpus/tiny.safetensors" ;;
            tokenizer) printf \
                'Hello world, 12345 <s> \xe2\x96\x81 \xff\xfe caf\xc3\xa9 \xf0\x9f\x99\x82\n' \
                           >"$corpus/text" ;;
        esac
    fi
    echo "== fuzz_$t for ${secs}s =="
    # crash reproducers land in $out, not in the source tree
    cd "$out"
    max_len=300000
    [ "$t" = tokenizer ] && max_len=4096
    "$out/fuzz_$t" "$corpus" -max_total_time="$secs" -max_len="$max_len" -rss_limit_mb=4096 \
        -print_final_stats=1 2>&1 \
        | grep -E "stat::number_of_executed_units|stat::new_units_added|ERROR|SUMMARY|BINGO" \
        || true
    cd - >/dev/null
done
