#!/usr/bin/env bash
# Quick start 2: install the dependencies, build, and run every test: the engine-only build
# (C compiler and libc alone) against the full build, every test under ASan+UBSan (the end-to-end
# tests then drive the sanitized ppserve), then all unit and end-to-end tests (ctest) on the default
# build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

echo "== build (default configuration) =="
bash scripts/build.sh

echo "== engine-only build (C compiler and libc only) =="
PP_BUILD_DIR=build-engine bash scripts/build.sh -DPP_ENGINE_ONLY=ON -DPP_CUDA=OFF
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
./build-engine/ppserve synth --out "$tmp" --shape tiny >/dev/null
./build-engine/ppserve run --model "$tmp/model.gguf" --prompt-ids 1,2,3 --max-tokens 4 --json \
    --dump-logits "$tmp/engine.logits" >/dev/null
./build/ppserve run --model "$tmp/model.gguf" --prompt-ids 1,2,3 --max-tokens 4 --json \
    --dump-logits "$tmp/full.logits" >/dev/null
cmp "$tmp/engine.logits" "$tmp/full.logits"
echo "engine-only build: logits bit-identical to the full build"

echo "== all tests under ASan+UBSan =="
PP_BUILD_DIR=build-asan bash scripts/build.sh -DPP_SANITIZE=address,undefined -DPP_CUDA=OFF
(cd build-asan && ctest --output-on-failure -j "$jobs")

echo "== all tests =="
(cd build && ctest --output-on-failure -j "$jobs")
