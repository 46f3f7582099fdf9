#!/usr/bin/env bash
# The main job: set up (packages, default model, build), then serve the default model over
# an OpenAI-compatible API on http://127.0.0.1:8000 (Ctrl-C stops it).
# Extra arguments go to `deltaserve serve` (e.g. --port 9000 --kv-policy deltakv --kv-keep 0.3).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/setup.sh
# The default model unless the arguments name one (a flag given twice is refused).
model=(--model "${DELTASERVE_MODELS_DIR:-models}/SmolLM2-135M-Instruct.Q4_1.gguf")
for a in "$@"; do
  case "$a" in --model|--model=*) model=() ;; esac
done
exec "${DELTASERVE_BUILD_DIR:-build}/bin/deltaserve" serve "${model[@]}" "$@"
