#include "deltaserve/kernels/dtype.h"

#include "deltaserve/common/status.h"

namespace deltaserve::kernels {

namespace {

struct Entry {
    uint32_t id;
    DTypeTraits traits;
};

// Types deltaserve knows; `supported` ones have dequantize and matmul kernels.
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, true}},       {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},    {3, {"Q4_1", 32, 20, true}},
    {6, {"Q5_0", 32, 22, false}},   {7, {"Q5_1", 32, 24, false}},
    {8, {"Q8_0", 32, 34, true}},    {9, {"Q8_1", 32, 36, false}},
    {10, {"Q2_K", 256, 84, false}}, {11, {"Q3_K", 256, 110, false}},
    {12, {"Q4_K", 256, 144, false}}, {13, {"Q5_K", 256, 176, false}},
    {14, {"Q6_K", 256, 210, true}}, {15, {"Q8_K", 256, 292, false}},
    {30, {"BF16", 1, 2, true}},
};

}  // namespace

const DTypeTraits* dtype_traits(uint32_t id) {
    for (const auto& e : kTypes) {
        if (e.id == id) return &e.traits;
    }
    return nullptr;
}

const DTypeTraits& dtype_traits(DType t) {
    const DTypeTraits* traits = dtype_traits(static_cast<uint32_t>(t));
    DS_CHECK(traits != nullptr, "unknown dtype");
    return *traits;
}

size_t row_bytes(DType t, int64_t n) {
    const DTypeTraits& tr = dtype_traits(t);
    DS_CHECK(n % tr.block_elems == 0, "row length not a multiple of the block size");
    return static_cast<size_t>(n / tr.block_elems) * static_cast<size_t>(tr.block_bytes);
}

}  // namespace deltaserve::kernels
