// The AVX-512 VNNI instantiation of the matmul kernels: vpdpbusd replaces the
// maddubs + madd pair and 32 vector registers allow wider tiles.
#include "../matmul_kernels.h"

namespace deltaserve::kernels {

namespace {
struct Avx512Vnni {
    static constexpr const char* kName = "avx512-vnni";
    static constexpr int kRows = 4;
    static constexpr int kCols = 4;
    static constexpr int kInterleavedCols = 8;      // 32 registers: 3 per token
    static constexpr int kGgmlInterleavedCols = 2;  // 16 accumulators
    static __m256i dot_u8s8(__m256i u, __m256i s) {
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
    }
    static __m256i dot_u8s8_add(__m256i acc, __m256i u, __m256i s) {
        return _mm256_dpbusd_epi32(acc, u, s);
    }
    // acc + the pair sums of u * s times sc (int16 lanes): K-quant sub-block scales;
    // vpdpwssd multiplies and adds in one instruction.
    static __m256i dot_u8s8_scaled_add(__m256i acc, __m256i u, __m256i s, __m256i sc) {
        return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), sc);
    }
};
}  // namespace

const MatmulTable& avx512_matmul_table() {
    static constexpr MatmulTable kTable = IsaKernels<Avx512Vnni>::table();
    return kTable;
}

}  // namespace deltaserve::kernels
