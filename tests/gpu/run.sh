#!/usr/bin/env bash
# tests/gpu/run.sh RESULTS_DIR: the CUDA backend's checks on a GPU host that has only the CUDA
# toolkit, CMake and a C compiler (no gRPC, protobuf-c, libconfig, jansson, PCRE2 or cmocka, no
# network). It builds the engine-only configuration with CUDA (build-gpu/, or $PP_GPU_BUILD), then:
#   1. test_cuda_ops: every CUDA op against the CPU backend's op on random shapes (ops.json/.log)
#   2. test_cuda_e2e: logits of synthetic GGUF models (`ppserve synth`), CUDA executor against the
#      CPU executor (e2e.json/.log)
#   2b. tests/gpu/gpu_less.sh: `ppserve run --device cuda:0` generates and `--device auto` picks
#      the GPU (appended to e2e.log)
#   3. bench_gpu: decode at batch 1 and 32 and prefill on a 4-layer slice of an 8B-shaped bf16
#      model, against the copy bandwidth and cuBLAS GEMM rate measured in the same run
#      (bench.json/.log)
#   4. test_cuda_ops again under compute-sanitizer's memcheck, where it can see the device
#      (appended to ops.log; 77 in summary.json when it cannot)
# Results go into RESULTS_DIR as each step ends (at most 8 files: build.log, ops.{json,log},
# e2e.{json,log}, bench.{json,log}, summary.json), so a run cut short keeps what it measured. Each
# step runs under `timeout`; the whole run is sized for 4 minutes on one H200.
#
# Exit status: 0 every check passed; 1 a check failed or timed out; 2 bad usage; 3 a tool is
# missing or the build failed; 4 built, but this host has no usable GPU (nothing was run).
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: tests/gpu/run.sh RESULTS_DIR" >&2
    exit 2
fi
results=$1
mkdir -p "$results" || exit 2
results=$(cd "$results" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${PP_GPU_BUILD:-$root/build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)
t_start=$(date +%s)
declare -A status=()
failed=0

# summary.json: each step's exit status (0 pass, 124 timeout, other failure) and the wall time.
summary() {
    local outcome=$1
    {
        printf '{"outcome": "%s", "seconds": %d, "steps": {' "$outcome" $(($(date +%s) - t_start))
        local first=1
        for k in configure build gpu ops e2e cli bench memcheck; do
            [ -n "${status[$k]+x}" ] || continue
            [ $first -eq 1 ] || printf ', '
            printf '"%s": %s' "$k" "${status[$k]}"
            first=0
        done
        printf '}}\n'
    } >"$results/summary.json"
}

# step NAME SECONDS LOG CMD...: runs CMD under timeout, output to LOG (appended), records status.
step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local t0
    t0=$(date +%s)
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    status[$name]=$rc
    echo "   $name: exit $rc after $(($(date +%s) - t0))s$([ $rc -eq 124 ] && echo ' (timed out)')"
    return $rc
}

for tool in cmake nvcc cc timeout; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "run.sh: '$tool' is not on PATH: the CUDA toolkit, CMake and a C compiler" \
             "are needed" >&2
        summary "missing $tool"
        exit 3
    fi
done

# NCCL: the toolkit may lack it (a Python image carries it as a wheel, nvidia/nccl/{include,lib}).
# Without it the CUDA backend builds for one GPU per stage, which is all these checks use.
nccl=()
if [ -n "${NCCL_ROOT:-}" ]; then
    nccl=(-DNCCL_ROOT="$NCCL_ROOT")
else
    hdr=$(timeout 30 find /usr/local /opt /usr/lib /usr/include -name nccl.h -path '*include*' \
          2>/dev/null | head -1)
    [ -n "$hdr" ] && nccl=(-DNCCL_ROOT="$(dirname "$(dirname "$hdr")")")
fi
echo "nccl: ${nccl[*]:-not found}"

# compute-sanitizer, where the toolkit has it (memcheck below and after a broken ops step).
sanitizer=$(command -v compute-sanitizer ||
            echo "$(dirname "$(command -v nvcc)")/compute-sanitizer")

# Compile for this GPU only when one answers (faster); otherwise for the default sm_80 and sm_90.
arch=""
if command -v nvidia-smi >/dev/null 2>&1; then
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
          | head -1 | tr -d ' .')
    [[ "$cap" =~ ^[0-9]+$ ]] && arch="-DCMAKE_CUDA_ARCHITECTURES=$cap"
fi

: >"$results/build.log"
step configure 90 "$results/build.log" cmake -S "$root" -B "$build" -DPP_ENGINE_ONLY=ON \
    -DCMAKE_BUILD_TYPE=Release $arch "${nccl[@]}"
if [ "${status[configure]}" -ne 0 ] || ! grep -q 'cuda=ON' "$results/build.log"; then
    echo "run.sh: configuring failed or CMake did not enable CUDA (see build.log)" >&2
    summary "configure failed"
    exit 3
fi
grep -E 'ppserve: engine_only|NCCL' "$results/build.log"
step build 150 "$results/build.log" cmake --build "$build" -j "$jobs" --target ppserve \
    test_cuda_ops test_cuda_e2e bench_gpu
if [ "${status[build]}" -ne 0 ]; then
    echo "run.sh: the build failed (see build.log)" >&2
    summary "build failed"
    exit 3
fi
ppserve=$build/ppserve
tests=$build/tests

devices=$("$ppserve" devices 2>&1)
echo "$devices" | tee -a "$results/build.log"
if ! grep -q '^cuda:0: ' <<<"$devices"; then
    status[gpu]=1
    echo "run.sh: built everything, but this host has no usable GPU, so nothing was run:" >&2
    grep '^cuda' <<<"$devices" >&2
    summary "no GPU"
    exit 4
fi
status[gpu]=0

: >"$results/ops.log"
step ops 60 "$results/ops.log" "$tests/test_cuda_ops" --json "$results/ops.json" || failed=1
tail -n 45 "$results/ops.log"
# A CUDA error (exit 3), a crash or a timeout stops every later family: run each family alone
# (launches synchronous, so the error names its op), and the first that breaks again under
# compute-sanitizer's memcheck where the toolkit has it.
if [ "${status[ops]}" -ne 0 ] && [ "${status[ops]}" -ne 1 ]; then
    for fam in embed rmsnorm rope elementwise rows topk moe_route attention matmul; do
        echo "-- $fam alone" >>"$results/ops.log"
        CUDA_LAUNCH_BLOCKING=1 timeout --kill-after=5 30 "$tests/test_cuda_ops" "$fam" \
            >>"$results/ops.log" 2>&1
        rc=$?
        echo "   ops $fam alone: exit $rc" | tee -a "$results/ops.log"
        if [ $rc -ne 0 ] && [ $rc -ne 1 ] && [ -x "$sanitizer" ] && [ -z "${sanitized:-}" ]; then
            sanitized=$fam
            echo "-- $fam under compute-sanitizer" >>"$results/ops.log"
            timeout --kill-after=5 60 "$sanitizer" --tool memcheck --print-limit 8 \
                "$tests/test_cuda_ops" "$fam" >>"$results/ops.log" 2>&1
            echo "   ops $fam under compute-sanitizer: exit $?" | tee -a "$results/ops.log"
        fi
    done
fi

models=$(mktemp -d)
trap 'rm -rf "$models"' EXIT
: >"$results/e2e.log"
small=(--dim 256 --layers 3 --heads 8 --kv-heads 2 --ffn 512 --vocab 1000 --ctx 512)
wide=(--dim 512 --layers 2 --heads 4 --kv-heads 2 --ffn 768 --vocab 2000 --ctx 512) # head_dim 128
synth() {
    local name=$1
    shift
    "$ppserve" synth --out "$models/$name" "$@" >>"$results/e2e.log" 2>&1 ||
        echo "synth $name failed" >>"$results/e2e.log"
}
synth llama_bf16 "${small[@]}" --dtype bf16
synth llama_hd128_bf16 "${wide[@]}" --dtype bf16 --tied
synth qwen2_bf16 "${small[@]}" --arch qwen2 --dtype bf16
synth mistral_swa_f16 "${small[@]}" --arch mistral --sliding-window 48 --dtype f16
synth mixtral_bf16 "${small[@]}" --arch mixtral --experts 4 --experts-used 2 --dtype bf16
synth qwen2moe_bf16 "${small[@]}" --arch qwen2moe --experts 8 --experts-used 2 --expert-ffn 128 \
    --shared-ffn 256 --norm-topk 1 --dtype bf16
synth llama_f32 "${small[@]}" --dtype f32
synth llama_q8_0 "${small[@]}" --dtype q8_0
m=$models
step e2e 60 "$results/e2e.log" "$tests/test_cuda_e2e" --json "$results/e2e.json" --tol 3e-2 \
    "$m/llama_bf16/model.gguf" "$m/llama_hd128_bf16/model.gguf" "$m/qwen2_bf16/model.gguf" \
    "$m/mistral_swa_f16/model.gguf" "$m/mixtral_bf16/model.gguf" "$m/qwen2moe_bf16/model.gguf" \
    --tol 6e-2 "$m/llama_f32/model.gguf" "$m/llama_q8_0/model.gguf" || failed=1
grep -E 'PASS|FAIL|error' "$results/e2e.log" | tail -n 12
# A model that could not run (exit 3, a crash or a timeout) may have broken the CUDA context for
# the ones after it: run each model alone, launches synchronous.
if [ "${status[e2e]}" -ne 0 ] && [ "${status[e2e]}" -ne 1 ]; then
    for f in "$m"/*/model.gguf; do
        tol=3e-2
        case $f in *f32* | *q8_0*) tol=6e-2 ;; esac
        echo "-- $f alone" >>"$results/e2e.log"
        CUDA_LAUNCH_BLOCKING=1 timeout --kill-after=5 30 "$tests/test_cuda_e2e" --tol $tol "$f" \
            >>"$results/e2e.log" 2>&1
        echo "   e2e $(basename "$(dirname "$f")") alone: exit $?" | tee -a "$results/e2e.log"
    done
fi

# The CLI on this GPU: `ppserve run --device cuda:0` generates, and `--device auto` picks cuda:0
# (tests/gpu/gpu_less.sh, which ctest runs on hosts without a GPU; appended to e2e.log).
echo "-- ppserve run on the GPU (tests/gpu/gpu_less.sh)" >>"$results/e2e.log"
step cli 60 "$results/e2e.log" bash "$root/tests/gpu/gpu_less.sh" "$ppserve" \
    "$tests/test_cuda_ops" "$tests/test_cuda_e2e" "$tests/bench_gpu" || failed=1

: >"$results/bench.log"
step bench 90 "$results/bench.log" "$tests/bench_gpu" --json "$results/bench.json" || failed=1
cat "$results/bench.log"

# Every op family once more under compute-sanitizer's memcheck, where the toolkit has it and the
# machine lets it see the device (a sandbox that hides the GPU from it is noted, not failed).
if [ -x "$sanitizer" ]; then
    echo "-- all op families under compute-sanitizer --tool memcheck" >>"$results/ops.log"
    step memcheck 120 "$results/ops.log" "$sanitizer" --tool memcheck --print-limit 8 \
        "$tests/test_cuda_ops"
    if grep -q 'ERROR SUMMARY: 0 errors' "$results/ops.log"; then
        status[memcheck]=0
    elif grep -q -i 'device not supported' "$results/ops.log"; then
        status[memcheck]=77
        echo "   memcheck: compute-sanitizer cannot see this device; not counted"
    elif [ "${status[memcheck]}" -eq 124 ]; then
        echo "   memcheck: timed out before its summary; not counted"
    else
        status[memcheck]=1
        failed=1
    fi
    grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$results/ops.log" | head -n 8
fi

summary "$([ $failed -eq 0 ] && echo pass || echo fail)"
echo "results in $results ($(($(date +%s) - t_start))s)"
exit $failed
