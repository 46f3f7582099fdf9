#!/usr/bin/env bash
# Builds deltaserve under the sanitizers (clang 14) and runs the tests there; any report
# fails the run.
#
#   tests/sanitizers/run.sh asan [CTEST ARGS]  # ASan+UBSan, build-asan (also the fuzz
#                                              # build): every test but those labelled slow
#   tests/sanitizers/run.sh tsan [CTEST ARGS]  # TSan, build-tsan: the transport, decode
#                                              # and api tests (and only what they need)
#
# TSan and Cap'n Proto: KJ synchronises its cross-thread calls inside libkj, which is not
# built with TSan; api/src/kj_handoff.h marks those hand-offs with TSan's annotations, so a
# report there is a real race. DELTASERVE_TSAN_MODULES picks other modules.
#
# Models and ../shared are found as in the normal test run (deploy/setup.sh fetches the
# default model); tests that need what is absent skip.
#   DELTASERVE_ASAN_BUILD_DIR / DELTASERVE_TSAN_BUILD_DIR  build folders
#   DELTASERVE_JOBS  build and ctest parallelism (default 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/sanitizers/clang.sh

mode=${1:?usage: tests/sanitizers/run.sh asan|tsan [ctest args]}
shift
jobs=${DELTASERVE_JOBS:-2}
ensure_clang
sanitizer_env

case "$mode" in
    asan)
        build=$DELTASERVE_ASAN_BUILD_DIR
        configure_asan_build
        targets=(all)
        labels=(-LE slow)
        ;;
    tsan)
        build=${DELTASERVE_TSAN_BUILD_DIR:-build-tsan}
        configure_sanitizer_build "$build" thread
        modules=${DELTASERVE_TSAN_MODULES:-transport,decode,api}
        targets=(transport_peer)
        for dir in ${modules//,/ }; do
            for f in tests/$dir/*_test.cpp; do targets+=("${dir}_$(basename "$f" .cpp)"); done
        done
        labels=(-L "^(${modules//,/|})\$")
        ;;
    *)
        echo "unknown mode '$mode' (asan or tsan)" >&2
        exit 2
        ;;
esac

start=$(date +%s)
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
echo "[sanitizers] $mode build: $(($(date +%s) - start)) s" >&2
start=$(date +%s)
rc=0
ctest --test-dir "$build" --output-on-failure -j"$jobs" "${labels[@]}" "$@" || rc=$?
echo "[sanitizers] $mode tests: $(($(date +%s) - start)) s" >&2
exit $rc
