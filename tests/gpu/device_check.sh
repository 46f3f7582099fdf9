#!/usr/bin/env bash
# The GPU checks, run once on a lent device machine from a bundle (tests/gpu/bundle.sh):
# the device's name, then each test program with its libraries from the bundle, each one's
# log and JUnit XML under $OUT (default ./gpu-out). Exits nonzero when a program fails.
# The default model and its DeltaKV profile come in parts beside the bundle
# (BUNDLE-model/part.*), joined here and checked against their sha256; without them the
# checks that need them skip. Then the GPU
# benchmark (bench/gpu/run_gpu_bench.sh), unless DELTASERVE_GPU_BENCH=0.
# Without a device (here, on the CPU path) the CUDA tests skip and the rest runs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The programs and benchmarks come xz-compressed (bundle.sh): unpacked beside it with
# Python's lzma (the device machine may lack xz), and removed at the end, so that the
# bundle stays as small as it travels.
unpacked=""
if [ -s "$here/programs.tar.xz" ] && [ ! -d "$here/bin" ]; then
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$here/programs.tar.xz" "$here" || { echo "cannot unpack programs.tar.xz" >&2; exit 1; }
    unpacked=1
fi
export DELTASERVE_TEST_DATA_DIR="$here/data"
payload=$(mktemp -d)
trap 'rm -rf "$payload"; [ -z "$unpacked" ] || rm -rf "$here/bin" "$here/bench"' EXIT
export DELTASERVE_MODELS_DIR="$payload/models"
export DELTASERVE_PROFILES_DIR="$payload/profiles"
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
    parts="$here-model"
    if ls "$parts"/part.* >/dev/null 2>&1; then
        cat "$parts"/part.* > "$payload/payload.tar"
        if [ "$(sha256sum "$payload/payload.tar" | awk '{print $1}')" = "$(cat "$parts/sha256")" ]; then
            tar -xf "$payload/payload.tar" -C "$payload" && rm "$payload/payload.tar"
            echo "model and profile: joined from $(ls "$parts"/part.* | wc -l) parts, sha256 ok"
        else
            echo "model and profile: the parts do not make them (sha256 differs): their checks skip"
        fi
    else
        echo "model and profile: no parts beside the bundle: their checks skip"
    fi
} > "$out/device.txt"
failed=0
for p in "$here"/bin/*; do
    name=$(basename "$p")
    if "$p" --gtest_output="xml:$out/$name.xml" > "$out/$name.log" 2>&1; then
        echo "ok      $name ($(grep -c '^\[       OK' "$out/$name.log") passed, $(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$out/$name.log") skipped)"
    else
        echo "FAILED  $name (see $name.log)"
        failed=1
    fi
done | tee "$out/summary.txt"
grep -q FAILED "$out/summary.txt" && failed=1
# The benchmark after the tests (DELTASERVE_GPU_BENCH=0 skips it).
if [ "${DELTASERVE_GPU_BENCH:-1}" != 0 ] && [ -x "$here/bench/run_gpu_bench.sh" ]; then
    OUT="$out" bash "$here/bench/run_gpu_bench.sh"
fi
exit $failed
