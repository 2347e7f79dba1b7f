#!/usr/bin/env bash
# ctest cuda.devices: the CUDA-linked binaries start on this host and say what they use. Without a
# usable GPU: `ppserve devices` names the reason, `run --device auto` runs on the CPU with a log
# line saying why, `run --device cuda:0` and `ppserve-stage --devices cuda:0` exit non-zero naming
# the problem, and the GPU programs of tests/gpu exit 77 (nothing run) with a message. With a GPU:
# cuda:0 runs and auto picks it.
# Usage: gpu_less.sh PPSERVE TEST_CUDA_OPS TEST_CUDA_E2E BENCH_GPU [PPSERVE_STAGE]
set -euo pipefail
ppserve=$1 ops=$2 e2e=$3 bench=$4 stage=${5:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

devices=$("$ppserve" devices) || fail "ppserve devices exited $?"
echo "$devices"
grep -q '^cpu: ' <<<"$devices" || fail "ppserve devices: no cpu line"
"$ppserve" synth --out "$tmp/m" --shape tiny --dtype bf16 >/dev/null
run=("$ppserve" run --model "$tmp/m/model.gguf" --prompt-ids 1,2,3 --max-tokens 2 --json)

if grep -q '^cuda:0: ' <<<"$devices"; then
    echo "a GPU is present: cuda:0 must run, and auto must pick it"
    "${run[@]}" --device cuda:0 >"$tmp/cuda.out" 2>"$tmp/cuda.err" ||
        fail "run --device cuda:0 failed on a GPU host: $(cat "$tmp/cuda.err")"
    grep -q '"ids":\[' "$tmp/cuda.out" || fail "run --device cuda:0 printed no result"
    "${run[@]}" --device auto --log-level info 2>"$tmp/auto.err" >/dev/null ||
        fail "run --device auto failed on a GPU host: $(cat "$tmp/auto.err")"
    grep -q 'device=cuda:0 requested=auto' "$tmp/auto.err" ||
        fail "auto did not pick cuda:0: $(cat "$tmp/auto.err")"
    echo "run --device cuda:0: $(head -c 200 "$tmp/cuda.out")"
    echo "PASS"
    exit 0
fi

grep -q '^cuda: \(none (.*); the CPU backend is used\|not built\)' <<<"$devices" ||
    fail "ppserve devices must say why no GPU is used"

"${run[@]}" --device auto --log-level info 2>"$tmp/auto.err" >"$tmp/auto.out" ||
    fail "run --device auto failed without a GPU: $(cat "$tmp/auto.err")"
grep -q 'device=cpu requested=auto reason="no GPU is used: ' "$tmp/auto.err" ||
    fail "run --device auto: no log line naming why the CPU is used: $(cat "$tmp/auto.err")"
grep -q '"ids":\[' "$tmp/auto.out" || fail "run --device auto printed no result"

set +e
"${run[@]}" --device cuda:0 >"$tmp/cuda.out" 2>"$tmp/cuda.err"
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "run --device cuda:0 succeeded on a host without a GPU"
[ ! -s "$tmp/cuda.out" ] || fail "run --device cuda:0 printed a result"
grep -q 'ppserve run: error: cuda:0: ' "$tmp/cuda.err" \
    || fail "unclear message: $(cat "$tmp/cuda.err")"
echo "run --device cuda:0: exit $rc: $(cat "$tmp/cuda.err")"

for prog in "$ops" "$e2e $tmp/m/model.gguf" "$bench"; do
    set +e
    $prog >"$tmp/p.out" 2>"$tmp/p.err"
    rc=$?
    set -e
    [ "$rc" -eq 77 ] || fail "$prog: expected exit 77 (no GPU), got $rc: $(cat "$tmp/p.err")"
    grep -q 'no usable GPU, nothing run: ' "$tmp/p.err" || fail "$prog: unclear message"
done
echo "tests/gpu programs: exit 77 with a message"

if [ -n "$stage" ]; then
    set +e
    timeout 20 "$stage" --coordinator 127.0.0.1:1 --model_root "$tmp" --devices cuda:0 \
        >/dev/null 2>"$tmp/stage.err"
    rc=$?
    set -e
    [ "$rc" -eq 1 ] || fail "ppserve-stage --devices cuda:0: expected exit 1, got $rc"
    grep -q "error: key 'devices': cuda:0: " "$tmp/stage.err" ||
        fail "ppserve-stage: unclear message: $(cat "$tmp/stage.err")"
    echo "ppserve-stage --devices cuda:0: exit 1: $(cat "$tmp/stage.err")"
fi
echo "PASS"
