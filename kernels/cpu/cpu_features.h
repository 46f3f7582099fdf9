// What this CPU can run, read once: what CPUID reports, and of it what the OS has enabled.
// Private to kernels/.
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

struct CpuFeatures {
    bool avx2 = false;
    bool fma = false;
    bool f16c = false;
    bool avx512f = false;
    bool avx512bw = false;
    bool avx512vl = false;
    bool avx512_vnni = false;  // with F, BW and VL: the ymm/zmm VNNI kernels can run
    bool avx512_bf16 = false;
    // XCR0, the register state the OS saves and so lets programs use (0 without OSXSAVE).
    uint64_t xcr0 = 0;
};

// XCR0 bits an instruction set needs: SSE and AVX state for AVX/AVX2/FMA/F16C; those and
// the opmask and upper ZMM state for AVX-512.
constexpr uint64_t kXcr0Avx = 0x6;
constexpr uint64_t kXcr0Avx512 = 0xE6;

const CpuFeatures& cpu_features();

// Whether every feature `f` claims has its register state enabled in f.xcr0.
bool os_enables(const CpuFeatures& f);

}  // namespace deltaserve::kernels
