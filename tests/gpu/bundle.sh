#!/usr/bin/env bash
# Gathers what the GPU checks run into one folder that travels to a lent device machine
# (the library's `device` tool: a bare machine with a driver, nvcc and CMake, none of our
# Debian libraries): the test programs, every shared library they load that is not the C
# library's (found with ldd: libcudart, spdlog, fmt, libstdc++ ...), the golden data,
# tests/gpu/device_check.sh, and in BUNDLE/bench the GPU
# benchmark (bench/gpu/run_gpu_bench.sh, its programs, and the tokenizer its random model
# takes; llama.cpp's CUDA llama-bench in BUNDLE/llama when bench/build_llama_server.sh --cuda
# made one). The programs and benchmarks travel xz-compressed in BUNDLE/programs.tar.xz,
# which device_check.sh unpacks. Built here, from build/
# (Release, with the CUDA backend: DELTASERVE_CUDA=AUTO finds /usr/local/cuda).
#
#   tests/gpu/bundle.sh [BUNDLE_DIR]     # default .gpu-bundle (ignored by git)
#
# The default model (94 MB) and its DeltaKV profile (83 MB) are more than one call carries
# (64 MiB): they go as one tar split into BUNDLE_DIR-model/part.aa, part.ab, ... (60 MiB at
# most each), one per call while the machine is still warm, the last call running
# device_check.sh, which joins them (tests/README.md, "On a lent GPU"). Without the parts
# the checks that need them skip. Tried here on the CPU path: the same script runs and
# the CUDA tests skip.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu-bundle}
build=${DELTASERVE_BUILD_DIR:-build}
model=${DELTASERVE_MODELS_DIR:-models}/SmolLM2-135M-Instruct.Q4_1.gguf
profile=${DELTASERVE_PROFILES_DIR:-profiles}/SmolLM2-135M-Instruct.Q4_1.gguf
programs=(kernels_cuda_parity_test kernels_backend_test kernels_cuda_forward_ops_test
          kernels_deltakv_ops_test kernels_deltakv_encode_test kvstore_device_tier_test
          model_smollm2_golden_test)
benches=(deltaserve-bench-kernels deltaserve-bench-runtime deltaserve-bench-fidelity)

rm -rf "$out" "$out-model"
mkdir -p "$out/bin" "$out/lib" "$out/data" "$out/bench"
for p in "${programs[@]}" "${benches[@]}"; do
    [ -x "$build/bin/$p" ] || { echo "bundle: $build/bin/$p is not built" >&2; exit 1; }
done
# Stripped: the bundle's 64 MiB go further.
for p in "${programs[@]}"; do strip -o "$out/bin/$p" "$build/bin/$p"; done
for p in "${benches[@]}"; do strip -o "$out/bench/$p" "$build/bin/$p"; done
cp bench/gpu/run_gpu_bench.sh bench/gpu/make_random_gguf.py "$out/bench/"
if [ -s "$model" ]; then
    python3 bench/gpu/make_random_gguf.py --tokenizer-from "$model" --tokenizer-only \
        --out "$out/bench/tokenizer.gguf" >/dev/null
fi
# llama.cpp's CUDA llama-bench (75 MiB) stripped and xz-compressed: 40 MiB. It loads the
# device's own libcudart, cuBLAS and NCCL (CUDA 13 there too).
llama=${DELTASERVE_CACHE_DIR:-$HOME/.cache/deltaserve}/llama.cpp-cuda/bin/llama-bench
if [ -x "$llama" ]; then
    mkdir -p "$out/llama"
    strip -o "$out/llama/llama-bench" "$llama"
    xz -T2 -6 -f "$out/llama/llama-bench"
fi
# Every library ldd resolves, but the C library's own (the device machine has its own, and
# the driver's libcuda comes from there too).
# llama-bench's cuBLAS and NCCL (hundreds of MiB) are the device's own.
for p in "${programs[@]/#/$build/bin/}" "${benches[@]/#/$build/bin/}" ${llama:+"$llama"}; do
    [ -x "$p" ] && ldd "$p" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libcuda.so.*) ;;
        libcublas*|libnccl*) ;;
        *) cp -L "$lib" "$out/lib/" ;;
    esac
done
cp tests/data/smollm2_golden.json "$out/data/"
[ -s /usr/share/common-licenses/GPL-3 ] && cp /usr/share/common-licenses/GPL-3 "$out/data/"
cp tests/gpu/device_check.sh "$out/"
# The programs and benchmarks xz-compressed (a quarter of their size): device_check.sh
# unpacks them.
tar -cJf "$out/programs.tar.xz" -C "$out" bin bench
rm -rf "$out/bin" "$out/bench"
du -sh "$out" | awk '{print "bundle: " $1 " in '"$out"' (the device tool carries 64 MiB at most)"}'
if [ -s "$model" ]; then
    # models/ and profiles/ as the tests find them, links followed.
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/models" "$stage/profiles/$(basename "$profile")" "$out-model"
    ln -s "$(realpath "$model")" "$stage/models/"
    for f in deltakv.json deltakv.safetensors; do
        [ -s "$profile/$f" ] && ln -s "$(realpath "$profile/$f")" "$stage/profiles/$(basename "$profile")/"
    done
    tar -chf "$out-model/payload.tar" -C "$stage" models profiles
    split -b 60M "$out-model/payload.tar" "$out-model/part."
    sha256sum "$out-model/payload.tar" | awk '{print $1}' > "$out-model/sha256"
    rm "$out-model/payload.tar"
    echo "bundle: the model and its DeltaKV profile in $out-model:" $(ls "$out-model")
fi
