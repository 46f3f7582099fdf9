#include "cpu_features.h"

namespace deltaserve::kernels {

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = [] {
        __builtin_cpu_init();
        CpuFeatures c;
        c.avx2 = __builtin_cpu_supports("avx2");
        c.fma = __builtin_cpu_supports("fma");
        c.f16c = true;  // every AVX2 CPU has it; the baseline build requires it anyway
        c.avx512f = __builtin_cpu_supports("avx512f");
        c.avx512bw = __builtin_cpu_supports("avx512bw");
        c.avx512vl = __builtin_cpu_supports("avx512vl");
        c.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
        c.avx512_vnni = c.avx512f && c.avx512bw && c.avx512vl && __builtin_cpu_supports("avx512vnni");
        return c;
    }();
    return f;
}

}  // namespace deltaserve::kernels
