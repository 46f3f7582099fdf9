#!/usr/bin/env bash
# Gathers what the GPU checks run into one folder that travels to a lent device machine
# (the library's `device` tool: a bare machine with a driver, nvcc and CMake, none of our
# Debian libraries): the test programs, every shared library they load that is not the C
# library's (found with ldd: libcudart, spdlog, fmt, libstdc++ ...), and
# tests/gpu/device_check.sh; about 6 MiB. Built here, from build/ (Release, with the CUDA
# backend: DELTASERVE_CUDA=AUTO finds /usr/local/cuda). The default model (94 MB) and its
# profiles are larger than the 64 MiB a call carries: checks that need them must send them
# in parts to a machine kept warm between calls.
#
#   tests/gpu/bundle.sh [BUNDLE_DIR]     # default .gpu-bundle (ignored by git)
#
# Then, on the device: bash BUNDLE_DIR/device_check.sh (results under $OUT). Tried here on the
# CPU path: the same script runs and the CUDA tests skip.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu-bundle}
build=${DELTASERVE_BUILD_DIR:-build}
programs=(kernels_cuda_parity_test kernels_backend_test)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for p in "${programs[@]}"; do
    [ -x "$build/bin/$p" ] || { echo "bundle: $build/bin/$p is not built" >&2; exit 1; }
    cp "$build/bin/$p" "$out/bin/"
done
# Every library ldd resolves, but the C library's own (the device machine has its own, and
# the driver's libcuda comes from there too).
for p in "${programs[@]}"; do
    ldd "$build/bin/$p" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libcuda.so.*) ;;
        *) cp -L "$lib" "$out/lib/" ;;
    esac
done
cp tests/gpu/device_check.sh "$out/"
du -sh "$out" | awk '{print "bundle: " $1 " in '"$out"' (the device tool carries 64 MiB at most)"}'
