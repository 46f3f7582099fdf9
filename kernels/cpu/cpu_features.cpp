#include "cpu_features.h"

#include <cpuid.h>

namespace deltaserve::kernels {

namespace {

// XCR0 through xgetbv, which is only defined when CPUID says the OS set CR4.OSXSAVE.
uint64_t read_xcr0() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return 0;
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<uint64_t>(hi) << 32) | lo;
}

}  // namespace

// A CPU may report an instruction set whose registers the OS (or a VM) does not save, and
// then using it faults: each family counts only with its XCR0 state enabled, checked here
// rather than trusted to the compiler runtime's own checks.
const CpuFeatures& cpu_features() {
    static const CpuFeatures f = [] {
        __builtin_cpu_init();
        CpuFeatures c;
        c.xcr0 = read_xcr0();
        const bool avx_state = (c.xcr0 & kXcr0Avx) == kXcr0Avx;
        const bool avx512_state = (c.xcr0 & kXcr0Avx512) == kXcr0Avx512;
        c.avx2 = avx_state && __builtin_cpu_supports("avx2");
        c.fma = avx_state && __builtin_cpu_supports("fma");
        c.f16c = c.avx2;  // every AVX2 CPU has it; the baseline build requires it anyway
        c.avx512f = avx512_state && __builtin_cpu_supports("avx512f");
        c.avx512bw = c.avx512f && __builtin_cpu_supports("avx512bw");
        c.avx512vl = c.avx512f && __builtin_cpu_supports("avx512vl");
        c.avx512_bf16 = c.avx512f && __builtin_cpu_supports("avx512bf16");
        c.avx512_vnni =
            c.avx512f && c.avx512bw && c.avx512vl && __builtin_cpu_supports("avx512vnni");
        return c;
    }();
    return f;
}

bool os_enables(const CpuFeatures& f) {
    const bool avx_family = f.avx2 || f.fma || f.f16c;
    const bool avx512_family =
        f.avx512f || f.avx512bw || f.avx512vl || f.avx512_vnni || f.avx512_bf16;
    if (avx_family && (f.xcr0 & kXcr0Avx) != kXcr0Avx) return false;
    if (avx512_family && (f.xcr0 & kXcr0Avx512) != kXcr0Avx512) return false;
    return true;
}

}  // namespace deltaserve::kernels
