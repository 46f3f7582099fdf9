#include "fuzz_support.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "deltaserve/common/logging.h"
#include "deltaserve/model/deltakv_profile.h"
#include "deltaserve/model/inference_context.h"

namespace deltaserve::fuzz {

namespace {

struct ScratchDir {
    std::string path;
    ScratchDir() {
        namespace fs = std::filesystem;
        const char* tmp = std::getenv("TMPDIR");
        const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm")
                              : tmp                        ? fs::path(tmp)
                                                           : fs::temp_directory_path();
        std::string templ = (base / "deltaserve-fuzz-XXXXXX").string();
        if (mkdtemp(templ.data()) == nullptr) std::abort();
        path = templ;
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

}  // namespace

const std::string& scratch_dir() {
    static ScratchDir dir;
    return dir.path;
}

std::string write_scratch_file(std::string_view name, std::span<const uint8_t> data) {
    std::string path = scratch_dir() + "/" + std::string(name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data.data()),
              static_cast<std::streamsize>(data.size()));
    if (!out) std::abort();
    return path;
}

std::string write_scratch_file(std::string_view name, std::string_view text) {
    return write_scratch_file(
        name, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

const model::Model& tiny_model() {
    static const std::unique_ptr<model::Model> model = [] {
        const int32_t header[7] = {32, 64, 3, 4, 2, 64, 512};  // dim .. seq_len
        const int64_t dim = 32, ff = 64, layers = 3, kv = 16, vocab = 64, head = 8, seq = 512;
        const int64_t n_floats =
            vocab * dim +
            layers * (dim + dim * dim + 2 * dim * kv + dim * dim + dim + 3 * ff * dim) + dim +
            seq * head;
        std::vector<float> w(static_cast<size_t>(n_floats));
        std::mt19937 rng(7);
        std::normal_distribution<float> nd(0.0f, 0.2f);
        for (float& x : w) x = nd(rng);
        std::vector<uint8_t> bytes(sizeof(header) + w.size() * sizeof(float));
        std::memcpy(bytes.data(), header, sizeof(header));
        std::memcpy(bytes.data() + sizeof(header), w.data(), w.size() * sizeof(float));
        model::LoadOptions lo;
        lo.show_progress = false;
        auto m = model::load_llama2c_model(write_scratch_file("tiny.bin", bytes), lo);
        if (!m.ok()) {
            std::fprintf(stderr, "tiny model: %s\n", m.error().to_string().c_str());
            std::abort();
        }
        return std::move(*m);
    }();
    return *model;
}

std::shared_ptr<const kvstore::DeltaKvProfile> tiny_deltakv_profile() {
    static const std::shared_ptr<const kvstore::DeltaKvProfile> profile = [] {
        const model::ModelConfig& c = tiny_model().config;
        auto p = std::make_shared<kvstore::DeltaKvProfile>();
        p->model_id = model::deltakv_model_id(c);
        p->d = 2 * c.kv_dim();
        p->m = 8;
        p->k = 2;
        p->stride = 5;
        p->sinks = 4;
        p->window = 8;
        const int64_t hidden = 12;
        std::mt19937 rng(11);
        std::normal_distribution<float> nd(0.0f, 0.3f);
        p->storage.reserve(static_cast<size_t>(c.n_layers) * 4);
        for (int32_t l = 0; l < c.n_layers; ++l) {
            auto add = [&](int64_t rows, int64_t cols) {
                p->storage.emplace_back(static_cast<size_t>(rows * cols));
                for (float& x : p->storage.back()) x = nd(rng);
                return kernels::WeightMatrix{kernels::DType::kF32, rows, cols,
                                             p->storage.back().data()};
            };
            kernels::DeltaKvLayer w;
            w.w1 = add(hidden, p->d);
            w.w2 = add(hidden, p->d);
            w.w3 = add(p->m, hidden);
            w.wd = add(p->d, p->m);
            p->layers.push_back(w);
            p->sensitivity_order.push_back(l);
        }
        kvstore::prepare_int4_decoders(*p);
        return p;
    }();
    return profile;
}

void exercise_model(const model::Model& m) {
    if (m.tokenizer) {
        for (const bool special : {false, true}) {
            auto ids =
                m.tokenizer->encode("Hello, world! <|im_start|> 123 \xc3\xa9", true, special);
            if (!ids.ok()) continue;
            for (const int32_t id : *ids) {
                if (id < 0 || id >= m.tokenizer->vocab_size()) std::abort();
            }
            (void)m.tokenizer->decode(*ids, special);
        }
    }
    model::ContextOptions co;
    co.n_ctx = 8;
    co.n_threads = 1;
    co.n_batch = 8;
    auto ctx = model::InferenceContext::create(m, co);
    if (!ctx.ok()) return;
    const int32_t tokens[2] = {0, m.config.n_vocab - 1};
    auto logits = (*ctx)->eval(tokens);
    if (logits.ok() && logits->size() != static_cast<size_t>(m.config.n_vocab)) std::abort();
}

std::pair<std::span<const uint8_t>, std::span<const uint8_t>> split_prefixed(
    std::span<const uint8_t> data) {
    if (data.size() < 4) return {data.first(0), data.first(0)};
    uint32_t n = 0;
    std::memcpy(&n, data.data(), 4);
    data = data.subspan(4);
    const size_t first = std::min<size_t>(n, data.size());
    return {data.first(first), data.subspan(first)};
}

void note_refusal(const Status& status) {
    static const bool verbose = std::getenv("DELTASERVE_FUZZ_VERBOSE") != nullptr;
    if (verbose && !status.ok()) std::fprintf(stderr, "refused: %s\n", status.to_string().c_str());
}

void quiet_logs() { spdlog::set_level(spdlog::level::off); }

}  // namespace deltaserve::fuzz
