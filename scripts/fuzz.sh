#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz with clang (ASan+UBSan) and runs each for SECONDS
# (default 60), seeded with small synthetic models. Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
# Exits 1 when a target does not build or a run finds a crash (the reproducer is left in the
# output folder), and 77 when clang cannot build libFuzzer targets here. PP_FUZZ_DIR: the output
# folder (default build-fuzz); PP_PPSERVE: the ppserve that writes the seeds (default
# build/ppserve, built when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf safetensors tokenizer hop config)
out=${PP_FUZZ_DIR:-$PWD/build-fuzz}
ppserve=${PP_PPSERVE:-$PWD/build/ppserve}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if ! command -v clang >/dev/null ||
   ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
     clang -x c -fsanitize=fuzzer -o "$out/probe" - 2>/dev/null; then
    echo "fuzz.sh: clang with libFuzzer is not available here; nothing was built"
    exit 77
fi
# the loaders need no compute kernels; the executor, which model/ also holds, links the thread
# pool and the CPU all-reduce but never runs here
sources=($(ls common/*.c | grep -v config.c) kernels/dtype.c kernels/cpu/threadpool.c
         kernels/comm/comm_cpu.c model/*.c)
flags=(-std=c11 -D_GNU_SOURCE -DPP_HAVE_JANSSON -DPP_HAVE_PCRE2 -I. -g -O1 -ffp-contract=off
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
[ -x "$ppserve" ] || { bash scripts/build.sh; ppserve=$PWD/build/ppserve; }
failed=0
# the data plane's framing (hop) also takes the protobuf-c code generated into the build folder
proto=$(dirname "$ppserve")/proto
for t in "${targets[@]}"; do
    extra=()
    [ "$t" = hop ] && extra=(common/rpc/hop.c common/rpc/wire.c "$proto"/ppserve/v1/*.pb-c.c
                            -I"$proto" $(pkg-config --cflags --libs grpc libprotobuf-c))
    # the daemons' configuration tables, with the checks of devices and cpu_weights
    [ "$t" = config ] && extra=(common/config.c stage/stage_config.c
                               coordinator/coordinator_config.c kernels/device_spec.c
                               kernels/cpu/weights_setting.c
                               $(pkg-config --cflags --libs libconfig))
    if ! clang "${flags[@]}" -o "$out/fuzz_$t" "tests/fuzz/fuzz_$t.c" "${sources[@]}" \
            "${extra[@]}" $(pkg-config --cflags --libs jansson libpcre2-8) -lm -lpthread; then
        echo "fuzz.sh: fuzz_$t does not build"
        failed=1
        continue
    fi
    corpus="$out/corpus_$t"
    mkdir -p "$corpus"
    if [ -z "$(ls -A "$corpus")" ]; then
        "$ppserve" synth --out "$out/seed" --shape tiny --format both --ctx 64 >/dev/null
        "$ppserve" synth --out "$out/seed-bpe" --shape tiny --tokenizer bpe --vocab 400 \
            --ctx 64 >/dev/null
        # a one-layer Mixtral and Qwen2-MoE: 3-D expert tensors, router, shared expert
        "$ppserve" synth --out "$out/seed-moe" --shape tiny-moe --layers 1 --ctx 64 >/dev/null
        "$ppserve" synth --out "$out/seed-qmoe" --shape tiny-moe --arch qwen2moe --layers 1 \
            --expert-ffn 32 --shared-ffn 32 --dtype q8_0 --ctx 64 >/dev/null
        case $t in
            gguf) cp "$out/seed/model.gguf" "$corpus/tiny.gguf"
                  cp "$out/seed-bpe/model.gguf" "$corpus/tiny-bpe.gguf"
                  cp "$out/seed-moe/model.gguf" "$corpus/tiny-moe.gguf"
                  cp "$out/seed-qmoe/model.gguf" "$corpus/tiny-qwen2moe.gguf" ;;
            safetensors) cp "$out/seed/hf/model.safetensors" "$corpus/tiny.safetensors" ;;
            hop) PP_FUZZ_SEED_OUT="$corpus" "$out/fuzz_$t" >/dev/null 2>&1 ;;
            config) cp deploy/config/stage.cfg deploy/config/coordinator.cfg "$corpus/" ;;
            tokenizer) printf \
                'Hello world, 12345 <s> \xe2\x96\x81 \xff\xfe caf\xc3\xa9 \xf0\x9f\x99\x82\n' \
                           >"$corpus/text" ;;
        esac
    fi
    echo "== fuzz_$t for ${secs}s =="
    max_len=300000
    [ "$t" = tokenizer ] && max_len=4096
    # libconfig 1.5 itself leaks its scanner's buffer on some syntax errors (a program of just
    # config_init, config_read_file and config_destroy shows it under valgrind): not ours to find
    env=(env)
    [ "$t" = config ] && env=(env ASAN_OPTIONS=detect_leaks=0) && max_len=8192
    # crash reproducers land in $out, not in the source tree
    rc=0
    (cd "$out" && "${env[@]}" "$out/fuzz_$t" "$corpus" -max_total_time="$secs" -max_len="$max_len" \
        -rss_limit_mb=4096 -print_final_stats=1 >"$out/fuzz_$t.log" 2>&1) || rc=$?
    grep -E "stat::number_of_executed_units|stat::new_units_added|ERROR|SUMMARY|BINGO" \
        "$out/fuzz_$t.log" || true
    if [ "$rc" -ne 0 ]; then
        echo "fuzz.sh: fuzz_$t exited with $rc; its log: $out/fuzz_$t.log"
        tail -40 "$out/fuzz_$t.log"
        failed=1
    fi
done
exit "$failed"
