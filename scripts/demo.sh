#!/usr/bin/env bash
# Quick start 1: install the dependencies, build, synthesise a demo model and generate from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
model=out/demo
if [ ! -f "$model/model.gguf" ]; then
    ./build/ppserve synth --out "$model" --shape demo --format both >/dev/null
fi
echo "== ppserve run on $model/model.gguf (a random-weight demo model: the text is noise) =="
./build/ppserve run --model "$model/model.gguf" --prompt "Once upon a time" --max-tokens 32
echo "== the same model as an HF checkpoint, JSON output =="
./build/ppserve run --model "$model/hf" --prompt "Once upon a time" --max-tokens 32 --json
