// GGUF tensor types: every quantization the kernels have loads; any other type is refused,
// the error naming the type and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "../../model/src/gguf_file.h"

namespace deltaserve::model {
namespace {

struct Tensor {
    std::string name;
    uint32_t type;
    int64_t cols, rows;
};

template <class T>
void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A GGUF v3 file with no metadata and the given 2-D tensors (zero bytes of data each).
std::string write_gguf(const std::string& name, const std::vector<Tensor>& tensors) {
    std::string out = "GGUF";
    put<uint32_t>(out, 3);
    put<uint64_t>(out, tensors.size());
    put<uint64_t>(out, 0);
    uint64_t offset = 0;
    std::vector<uint64_t> sizes;
    for (const Tensor& t : tensors) {
        put<uint64_t>(out, t.name.size());
        out += t.name;
        put<uint32_t>(out, 2);
        put<int64_t>(out, t.cols);
        put<int64_t>(out, t.rows);
        put<uint32_t>(out, t.type);
        put<uint64_t>(out, offset);
        const kernels::DTypeTraits* tr = kernels::dtype_traits(t.type);
        const uint64_t bytes =
            tr ? static_cast<uint64_t>(t.cols / tr->block_elems * tr->block_bytes * t.rows) : 0;
        offset += (bytes + 31) / 32 * 32;
    }
    out.resize((out.size() + 31) / 32 * 32, '\0');
    out.resize(out.size() + offset, '\0');
    const std::string path =
        (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()) + ".gguf"))
            .string();
    std::ofstream(path, std::ios::binary) << out;
    return path;
}

TEST(GgufTensorTypes, EveryQuantizationWithKernelsLoads) {
    const std::vector<std::pair<uint32_t, int64_t>> types = {
        {2, 32},   {3, 32},   {6, 32},   {7, 32},   {8, 32},   {20, 32},
        {10, 256}, {11, 256}, {12, 256}, {13, 256}, {14, 256}, {23, 256}};
    std::vector<Tensor> tensors;
    for (const auto& [type, cols] : types)
        tensors.push_back({"t" + std::to_string(type), type, 2 * cols, 3});
    const std::string path = write_gguf("gguf_types_ok", tensors);
    auto g = GgufFile::open(path);
    std::filesystem::remove(path);
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    ASSERT_EQ(g->tensors().size(), types.size());
    for (size_t i = 0; i < types.size(); ++i) {
        const auto& tr = kernels::dtype_traits(g->tensors()[i].type);
        EXPECT_EQ(static_cast<uint32_t>(g->tensors()[i].type), types[i].first);
        EXPECT_EQ(g->tensors()[i].bytes, static_cast<size_t>(2 * 3 * tr.block_bytes)) << tr.name;
    }
}

TEST(GgufTensorTypes, AMissingTypeIsRefusedNamingItAndTheTensor) {
    const std::pair<uint32_t, std::string> missing[] = {
        {16, "IQ2_XXS"}, {21, "IQ3_S"}, {29, "IQ1_M"}, {39, "MXFP4"}, {99, "99"}};
    for (const auto& [type, says] : missing) {
        const std::string path =
            write_gguf("gguf_types_missing",
                       {{"token_embd.weight", 8, 256, 2}, {"blk.3.attn_q.weight", type, 256, 2}});
        auto g = GgufFile::open(path);
        std::filesystem::remove(path);
        ASSERT_FALSE(g.ok()) << says;
        EXPECT_EQ(g.error().code(), StatusCode::kUnimplemented) << g.error().to_string();
        const std::string msg = g.error().message();
        EXPECT_NE(msg.find("'blk.3.attn_q.weight'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("type " + says), std::string::npos) << msg;
    }
}

}  // namespace
}  // namespace deltaserve::model
