#!/usr/bin/env bash
# The GPU checks, run once on a lent device machine from a bundle (tests/gpu/bundle.sh):
# the device's name, then each test program with its libraries from the bundle, each one's
# log and JUnit XML under $OUT (default ./gpu-out). Exits nonzero when a program fails.
# Without a device (here, on the CPU path) the CUDA tests skip and the rest runs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
} > "$out/device.txt"
failed=0
for p in "$here"/bin/*; do
    name=$(basename "$p")
    if "$p" --gtest_output="xml:$out/$name.xml" > "$out/$name.log" 2>&1; then
        echo "ok      $name ($(grep -c '^\[       OK' "$out/$name.log") passed, $(grep -c '^\[  SKIPPED' "$out/$name.log") skipped)"
    else
        echo "FAILED  $name (see $name.log)"
        failed=1
    fi
done | tee "$out/summary.txt"
grep -q FAILED "$out/summary.txt" && failed=1
exit $failed
