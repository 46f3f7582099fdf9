// The AVX2 baseline instantiation of the matmul kernels.
#include "matmul_kernels.h"

namespace deltaserve::kernels {

namespace {
struct Avx2 {
    static constexpr const char* kName = "avx2";
    static constexpr int kRows = 4;
    static constexpr int kCols = 2;  // 16 ymm registers: 8 accumulators + 4 weight blocks
    // 16 ymm registers: 3 per token (not measured on an AVX2-only host), and in ggml's
    // order 16 accumulators for 2 tokens (spills, but each weight load serves two tokens).
    static constexpr int kInterleavedCols = 4;
    static constexpr int kGgmlInterleavedCols = 2;
    static __m256i dot_u8s8(__m256i u, __m256i s) {
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    }
    static __m256i dot_u8s8_add(__m256i acc, __m256i u, __m256i s) {
        return _mm256_add_epi32(acc, dot_u8s8(u, s));
    }
    // acc + the pair sums of u * s times sc (int16 lanes): K-quant sub-block scales.
    static __m256i dot_u8s8_scaled_add(__m256i acc, __m256i u, __m256i s, __m256i sc) {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc));
    }
};
}  // namespace

const MatmulTable& avx2_matmul_table() {
    static constexpr MatmulTable kTable = IsaKernels<Avx2>::table();
    return kTable;
}

}  // namespace deltaserve::kernels
