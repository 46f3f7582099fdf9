// The kernel table of one instruction set: every tile and row-group kernel of
// matmul_kernels.h and the headers it includes, wrapped for run_tiles / run_interleaved and
// gathered into a MatmulTable. Part of matmul_kernels.h (internal linkage, one instantiation
// per ISA).
#pragma once

namespace deltaserve::kernels {
namespace {

// The kernel table of one ISA. Isa provides dot_u8s8, dot_u8s8_add and the tile shapes.
template <class Isa>
struct IsaKernels {
    // The kernels of Q5_0, Q5_1, IQ4_NL (B: matmul_q5_iq4nl.h) and of the K-quants and IQ4_XS
    // (K: matmul_kquants.h). They have no kGgml variant: both orders run these.
    template <class B>
    struct Blocks32 {
        template <int R, int C>
        struct Tile {
            static void run(const uint8_t* const* w, const Activations& a, int64_t t, int64_t nb,
                            float* y, int64_t ldy, int64_t r) {
                tile_b32<Isa, B, R, C>(w, a, t, nb, y, ldy, r);
            }
        };
        static void rows(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                         int64_t r0, int64_t r1) {
            run_tiles_by_rows<Isa::kRows, Isa::kCols, Tile>(w, a, w.cols / kQK, y, ldy, r0, r1);
        }
    };
    template <class K>
    struct SuperBlocks {
        template <int R, int C>
        struct Tile {
            static void run(const uint8_t* const* w, const Activations& a, int64_t t, int64_t nb,
                            float* y, int64_t ldy, int64_t r) {
                tile_k<Isa, K, R, C>(w, a, t, nb, y, ldy, r);
            }
        };
        static void rows(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                         int64_t r0, int64_t r1) {
            run_tiles_by_rows<Isa::kRows, Isa::kCols, Tile>(w, a, w.cols / kQKK, y, ldy, r0, r1);
        }
    };

    template <int C>
    struct Q4_Kx8 {
        static void run(const uint8_t* g, const Activations& a, int64_t t, int64_t nb, float* y,
                        int64_t ldy, int64_t r) {
            x8_q4_k<Isa, C>(g, a, t, nb, y, ldy, r);
        }
    };
    template <int C>
    struct Q6_Kx8 {
        static void run(const uint8_t* g, const Activations& a, int64_t t, int64_t nb, float* y,
                        int64_t ldy, int64_t r) {
            x8_q6_k<Isa, C>(g, a, t, nb, y, ldy, r);
        }
    };
    static void q6_kx8(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                       int64_t r0, int64_t r1) {
        run_interleaved<Isa::kInterleavedCols, Q6_Kx8, kQKK>(w, a, y, ldy, r0, r1);
    }
    static void q4_kx8(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                       int64_t r0, int64_t r1) {
        run_interleaved<Isa::kInterleavedCols, Q4_Kx8, kQKK>(w, a, y, ldy, r0, r1);
    }

    // The quantized kernels in one summation order (kGgml: matmul_ggml_order.h).
    template <bool kGgml>
    struct Quant {
        template <int R, int C>
        struct Q4_0 {
            static void run(const uint8_t* const* w, const Activations& a, int64_t t, int64_t nb,
                            float* y, int64_t ldy, int64_t r) {
                if constexpr (kGgml) {
                    tile_q4_ggml<Isa, false, R, C>(w, a, t, nb, y, ldy, r);
                } else {
                    tile_q4<Isa, false, R, C>(w, a, t, nb, y, ldy, r);
                }
            }
        };
        template <int R, int C>
        struct Q4_1 {
            static void run(const uint8_t* const* w, const Activations& a, int64_t t, int64_t nb,
                            float* y, int64_t ldy, int64_t r) {
                if constexpr (kGgml) {
                    tile_q4_ggml<Isa, true, R, C>(w, a, t, nb, y, ldy, r);
                } else {
                    tile_q4<Isa, true, R, C>(w, a, t, nb, y, ldy, r);
                }
            }
        };
        template <int R, int C>
        struct Q8_0 {
            static void run(const uint8_t* const* w, const Activations& a, int64_t t, int64_t nb,
                            float* y, int64_t ldy, int64_t r) {
                if constexpr (kGgml) {
                    tile_q8_0_ggml<Isa, R, C>(w, a, t, nb, y, ldy, r);
                } else {
                    tile_q8_0<Isa, R, C>(w, a, t, nb, y, ldy, r);
                }
            }
        };
        template <int C>
        struct Q4_0x8 {
            static void run(const uint8_t* g, const Activations& a, int64_t t, int64_t nb, float* y,
                            int64_t ldy, int64_t r) {
                if constexpr (kGgml) {
                    x8_q4_ggml<Isa, false, C>(g, a, t, nb, y, ldy, r);
                } else {
                    x8_q4<Isa, false, C>(g, a, t, nb, y, ldy, r);
                }
            }
        };
        template <int C>
        struct Q4_1x8 {
            static void run(const uint8_t* g, const Activations& a, int64_t t, int64_t nb, float* y,
                            int64_t ldy, int64_t r) {
                if constexpr (kGgml) {
                    x8_q4_ggml<Isa, true, C>(g, a, t, nb, y, ldy, r);
                } else {
                    x8_q4<Isa, true, C>(g, a, t, nb, y, ldy, r);
                }
            }
        };
        template <int C>
        struct Q8_0x8 {
            static void run(const uint8_t* g, const Activations& a, int64_t t, int64_t nb, float* y,
                            int64_t ldy, int64_t r) {
                if constexpr (kGgml) {
                    x8_q8_0_ggml<Isa, C>(g, a, t, nb, y, ldy, r);
                } else {
                    x8_q8_0<Isa, C>(g, a, t, nb, y, ldy, r);
                }
            }
        };
        // ggml's order keeps 8 accumulators per token: fewer tokens per pass.
        static constexpr int kCols = kGgml ? Isa::kGgmlInterleavedCols : Isa::kInterleavedCols;

        static void q4_0(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                         int64_t r0, int64_t r1) {
            run_tiles<Isa::kRows, Isa::kCols, Q4_0>(w, a, w.cols / kQK, y, ldy, r0, r1);
        }
        static void q4_1(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                         int64_t r0, int64_t r1) {
            run_tiles<Isa::kRows, Isa::kCols, Q4_1>(w, a, w.cols / kQK, y, ldy, r0, r1);
        }
        static void q8_0(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                         int64_t r0, int64_t r1) {
            run_tiles<Isa::kRows, Isa::kCols, Q8_0>(w, a, w.cols / kQK, y, ldy, r0, r1);
        }
        static void q4_0x8(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                           int64_t r0, int64_t r1) {
            run_interleaved<kCols, Q4_0x8>(w, a, y, ldy, r0, r1);
        }
        static void q4_1x8(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                           int64_t r0, int64_t r1) {
            run_interleaved<kCols, Q4_1x8>(w, a, y, ldy, r0, r1);
        }
        static void q8_0x8(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                           int64_t r0, int64_t r1) {
            run_interleaved<kCols, Q8_0x8>(w, a, y, ldy, r0, r1);
        }
        static constexpr QuantKernels table() {
            return QuantKernels{&q4_0,
                                &q4_1,
                                &q8_0,
                                &q4_0x8,
                                &q4_1x8,
                                &q8_0x8,
                                &Blocks32<BQ5<false>>::rows,
                                &Blocks32<BQ5<true>>::rows,
                                &Blocks32<BIQ4NL>::rows,
                                &SuperBlocks<KQ2>::rows,
                                &SuperBlocks<KQ3>::rows,
                                &SuperBlocks<KQ4>::rows,
                                &SuperBlocks<KQ5>::rows,
                                &SuperBlocks<KQ6>::rows,
                                &SuperBlocks<KIQ4XS>::rows,
                                &q4_kx8,
                                &q6_kx8};
        }
    };

    template <DType T>
    struct Float {
        template <int R, int C>
        struct Tile {
            static void run(const uint8_t* const* w, const Activations& a, int64_t t, int64_t n,
                            float* y, int64_t ldy, int64_t r) {
                tile_float<T, R, C>(w, a, t, n, y, ldy, r);
            }
        };
    };
    static void f32(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy, int64_t r0,
                    int64_t r1) {
        run_tiles<4, 2, Float<DType::kF32>::template Tile>(w, a, w.cols, y, ldy, r0, r1);
    }
    static void f16(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy, int64_t r0,
                    int64_t r1) {
        run_tiles<4, 2, Float<DType::kF16>::template Tile>(w, a, w.cols, y, ldy, r0, r1);
    }
    static void bf16(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy, int64_t r0,
                     int64_t r1) {
        run_tiles<4, 2, Float<DType::kBF16>::template Tile>(w, a, w.cols, y, ldy, r0, r1);
    }

    static constexpr MatmulTable table() {
        return MatmulTable{
            Isa::kName, {Quant<false>::table(), Quant<true>::table()}, &f32, &f16, &bf16};
    }
};

}  // namespace
}  // namespace deltaserve::kernels
