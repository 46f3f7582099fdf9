#!/usr/bin/env bash
# The main job: set up (packages, default model, build), then chat with the default model.
# Extra arguments go to `deltaserve chat` (e.g. --temperature 0).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/setup.sh
exec "${DELTASERVE_BUILD_DIR:-build}/bin/deltaserve" chat \
  --model "${DELTASERVE_MODELS_DIR:-models}/SmolLM2-135M-Instruct.Q4_1.gguf" "$@"
