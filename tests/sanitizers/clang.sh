# Sourced by tests/sanitizers/run.sh and tests/fuzz/run.sh: clang 14 with its sanitizer and
# libFuzzer runtimes (Debian 12: clang-14, libclang-rt-14-dev; llvm-14 for llvm-symbolizer),
# installed on first use so that a plain deploy/setup.sh does not pay for them, and the
# configuration of the sanitizer builds.

DELTASERVE_CLANG_PACKAGES=(clang-14 libclang-rt-14-dev llvm-14)

ensure_clang() {
    local missing=() p
    for p in "${DELTASERVE_CLANG_PACKAGES[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "[sanitizers] installing ${missing[*]}" >&2
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
    export PATH="/usr/lib/llvm-14/bin:$PATH"
}

# configure_sanitizer_build DIR SANITIZERS [cmake args...]: a clang build with -O2 and line
# tables (stack traces name file:line at a fraction of -g's build time).
configure_sanitizer_build() {
    local dir=$1 sanitize=$2
    shift 2
    # A cache made with another compiler is dropped first: CMake would drop it itself on
    # seeing the compiler change, and configure again without the options below.
    if [ -f "$dir/CMakeCache.txt" ] &&
        ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=/usr/bin/clang++-14" "$dir/CMakeCache.txt"; then
        rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
    fi
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_COMPILER=/usr/bin/clang-14 -DCMAKE_CXX_COMPILER=/usr/bin/clang++-14 \
        "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only" \
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only" \
        -DDELTASERVE_CUDA=OFF "-DDELTASERVE_SANITIZE=$sanitize" "$@" >/dev/null
    if ! grep -qx "DELTASERVE_SANITIZE:STRING=$sanitize" "$dir/CMakeCache.txt"; then
        echo "[sanitizers] $dir is not configured with $sanitize" >&2
        return 1
    fi
}

# The ASan+UBSan build is also the fuzz build: one set of objects serves both.
DELTASERVE_ASAN_BUILD_DIR=${DELTASERVE_ASAN_BUILD_DIR:-build-asan}
configure_asan_build() {
    configure_sanitizer_build "$DELTASERVE_ASAN_BUILD_DIR" address,undefined -DDELTASERVE_FUZZ=ON
}

# Run-time options: every report fails the run; the suppressions name third-party code only.
sanitizer_env() {
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$here/ubsan.supp${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    # Sanitized code runs 2-5x slower: tests that bound a time (a turn cancelled within a
    # second) scale their bounds by this (tests/support/test_paths.h, time_scale()).
    export DELTASERVE_TEST_TIME_SCALE=${DELTASERVE_TEST_TIME_SCALE:-5}
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
}
