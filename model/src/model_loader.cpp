#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "deltaserve/kernels/repack.h"
#include "deltaserve/model/model.h"

namespace deltaserve::model {

void ModelWeights::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

uint8_t* ModelWeights::allocate(size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    DS_CHECK(p != nullptr, "out of memory allocating weights");
    std::memset(p, 0, bytes);
    buffers.emplace_back(static_cast<uint8_t*>(p));
    return buffers.back().get();
}

void ModelWeights::repack() {
    auto one = [this](WeightMatrix& m) {
        if (!kernels::repackable(m)) return;
        const size_t bytes = static_cast<size_t>(m.rows) * m.row_stride();
        const void* mapped = m.data;
        m = kernels::repack_rows(m, allocate(bytes));
        for (const MappedFile& f : files) f.release(mapped, bytes);
    };
    const bool tied = output.data == token_embd.data;
    one(token_embd);
    if (tied) {
        output = token_embd;
    } else {
        one(output);
    }
    for (LayerWeights& l : layers) {
        for (WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) one(*m);
    }
}

namespace {

Result<std::unique_ptr<Model>> load_by_format(const std::string& path, const LoadOptions& options) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status)) return not_found("model not found: " + path);
    if (std::filesystem::is_directory(status)) return load_hf_model(path, options);
    char magic[4] = {};
    std::ifstream in(path, std::ios::binary);
    in.read(magic, 4);
    if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0)
        return load_gguf_model(path, options);
    return load_llama2c_model(path, options);
}

}  // namespace

Result<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& options) {
    auto model = load_by_format(path, options);
    if (model && options.repack) (*model)->weights.repack();
    return model;
}

}  // namespace deltaserve::model
