#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz/*_fuzzer.cpp) if needed and runs each for
# SECONDS (default 30) from its seed corpus, two at a time. Prints, per harness, the inputs
# executed and the coverage reached (libFuzzer's final cov: edges and ft: features); fails
# when a harness crashes, leaks, times out or runs out of memory, leaving the input under
# $DELTASERVE_FUZZ_OUT (default build-asan/fuzz-out/<harness>/) with its report.
#
#   tests/fuzz/run.sh [SECONDS] [HARNESS...]   # e.g. tests/fuzz/run.sh 60 gguf kv_import
#   tests/fuzz/run.sh --seeds                  # rewrites the seed corpora (make_seeds.py and
#                                              # the harnesses of deltaserve's own formats)
# Reproduce a crash: build-asan/bin/fuzz_<harness> <input>
#   DELTASERVE_ASAN_BUILD_DIR  the ASan+UBSan+fuzz build (default build-asan)
#   DELTASERVE_FUZZ_JOBS       harnesses run at once (default 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/sanitizers/clang.sh

seeds=0
secs=30
if [ "${1:-}" = "--seeds" ]; then
    seeds=1
    shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
    secs=$1
    shift
fi
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
    for f in tests/fuzz/*_fuzzer.cpp; do
        n=$(basename "$f" _fuzzer.cpp)
        harnesses+=("$n")
    done
fi

ensure_clang
sanitizer_env
BUILD=$DELTASERVE_ASAN_BUILD_DIR
[ -f "$BUILD/build.ninja" ] || configure_asan_build
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
start=$(date +%s)
cmake --build "$BUILD" -j"${DELTASERVE_JOBS:-2}" --target "${targets[@]}"
echo "[fuzz] build: $(($(date +%s) - start)) s" >&2

if ((seeds)); then
    python3 tests/fuzz/make_seeds.py tests/fuzz/corpus
    for h in kv_import wire_format kv_block session_bundle; do
        rm -rf "tests/fuzz/corpus/$h"
        mkdir -p "tests/fuzz/corpus/$h"
        DELTASERVE_FUZZ_WRITE_SEEDS="tests/fuzz/corpus/$h" "$BUILD/bin/fuzz_$h"
    done
    du -sh tests/fuzz/corpus
    exit 0
fi

OUT=${DELTASERVE_FUZZ_OUT:-$BUILD/fuzz-out}
run_one() {
    local h=$1 dir="$OUT/$1"
    rm -rf "$dir"
    mkdir -p "$dir/corpus" "$dir/artifacts"
    # New inputs go to the first folder; the committed seeds are only read.
    local rc=0
    "$BUILD/bin/fuzz_$h" -max_total_time="$secs" -print_final_stats=1 -timeout=10 \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 \
        -artifact_prefix="$dir/artifacts/" "$dir/corpus" "tests/fuzz/corpus/$h" \
        >"$dir/log" 2>&1 || rc=$?
    echo "$rc" >"$dir/rc"
}

for h in "${harnesses[@]}"; do
    while (($(jobs -rp | wc -l) >= ${DELTASERVE_FUZZ_JOBS:-2})); do wait -n || true; done
    run_one "$h" &
done
wait
status=0
printf '%-16s %12s %8s %8s %s\n' harness executions cov ft result
for h in "${harnesses[@]}"; do
    rc=$(cat "$OUT/$h/rc" 2>/dev/null || echo 1)
    log="$OUT/$h/log"
    execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || true)
    last=$(grep -E '^#[0-9]+.*cov: [0-9]+' "$log" | tail -1 || true)
    cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    result=ok
    if ((rc != 0)); then
        result="FAILED (exit $rc): $(ls "$OUT/$h/artifacts" 2>/dev/null | head -1)"
        status=1
    fi
    printf '%-16s %12s %8s %8s %s\n' "$h" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$result"
    if ((rc != 0)); then
        grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -20 | sed 's/^/    /'
        echo "    full report: $log; input: $OUT/$h/artifacts/" >&2
    fi
done
exit $status
