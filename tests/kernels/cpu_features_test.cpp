// The kernels' dispatch reads CPUID and XCR0: an instruction set the OS has not enabled is
// never reported, so never chosen.
#include <gtest/gtest.h>

#include "cpu_features.h"
#include "deltaserve/kernels/matmul.h"

namespace deltaserve::kernels {
namespace {

TEST(CpuFeatures, ReportsOnlyWhatTheOsEnables) {
    const CpuFeatures& f = cpu_features();
    EXPECT_TRUE(os_enables(f)) << "xcr0 " << std::hex << f.xcr0;
    // The baseline build needs AVX2; a machine running this test has it, and its state.
    EXPECT_TRUE(f.avx2);
    EXPECT_EQ(f.xcr0 & kXcr0Avx, kXcr0Avx);
    if (f.avx512_vnni) {
        EXPECT_EQ(cpu_kernel_isa(), "avx512-vnni");
    }
}

TEST(CpuFeatures, AFeatureWithoutItsRegisterStateIsNotEnabled) {
    CpuFeatures claimed;
    claimed.avx2 = claimed.fma = claimed.f16c = true;
    claimed.avx512f = claimed.avx512bw = claimed.avx512vl = claimed.avx512_vnni = true;
    claimed.xcr0 = 0x7;  // x87, SSE, AVX: what a VM that saves no ZMM state reports
    EXPECT_FALSE(os_enables(claimed));
    claimed.xcr0 = 0xE7;
    EXPECT_TRUE(os_enables(claimed));
    CpuFeatures avx_only;
    avx_only.avx2 = true;
    avx_only.xcr0 = 0x3;  // SSE without AVX state
    EXPECT_FALSE(os_enables(avx_only));
}

}  // namespace
}  // namespace deltaserve::kernels
