// What this CPU can run, read once from CPUID. Private to kernels/.
#pragma once

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
};

const CpuFeatures& cpu_features();

}  // namespace deltaserve::kernels
