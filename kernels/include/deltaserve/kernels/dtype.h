// Element and block types of weights and activations. Ids are ggml's, so GGUF type
// fields map directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace deltaserve::kernels {

enum class DType : uint32_t {
    kF32 = 0,
    kF16 = 1,
    kQ4_0 = 2,
    kQ4_1 = 3,
    kQ5_0 = 6,
    kQ5_1 = 7,
    kQ8_0 = 8,
    kQ8_1 = 9,
    kQ2_K = 10,
    kQ3_K = 11,
    kQ4_K = 12,
    kQ5_K = 13,
    kQ6_K = 14,
    kQ8_K = 15,
    kIQ4_NL = 20,
    kIQ4_XS = 23,
    kBF16 = 30,
};

struct DTypeTraits {
    std::string_view name;
    int block_elems;  // elements per block (1 for plain floats)
    int block_bytes;  // bytes per block
    bool supported;   // has dequantize and matmul kernels here
};

// Traits of a type id; nullptr for ids deltaserve does not know. ggml's other types are known
// by name (unsupported), so a file holding one is refused naming it.
const DTypeTraits* dtype_traits(uint32_t id);
const DTypeTraits& dtype_traits(DType t);

// Bytes of a row of n elements (n must be a multiple of the block size).
size_t row_bytes(DType t, int64_t n);

// A 2-D weight matrix used as y = W x: `rows` outputs, `cols` inputs, each row
// row_bytes(type, cols) bytes. Does not own `data`. With `interleave` 1 the rows follow one
// another (row-major); with kRowInterleave (repack.h) each group of that many rows is stored
// block by block, the rows' blocks interleaved, and row() does not apply
// (dequantize_weight_row does).
struct WeightMatrix {
    DType type = DType::kF32;
    int64_t rows = 0;
    int64_t cols = 0;
    const void* data = nullptr;
    int32_t interleave = 1;

    size_t row_stride() const { return row_bytes(type, cols); }
    const uint8_t* row(int64_t r) const {
        return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_stride();
    }
};

}  // namespace deltaserve::kernels
