#include "deltaserve/model/trimkv_profile.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "deltaserve/model/deltakv_profile.h"
#include "safetensors.h"

namespace deltaserve::model {

Result<std::shared_ptr<const kvstore::RetentionGates>> load_trimkv_gates(const std::string& json_path,
                                                                        const ModelConfig& config) {
    std::ifstream in(json_path);
    if (!in) return not_found("cannot open TRIM-KV gates " + json_path + " (make them with deltactl calibrate)");
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("format", "") != "deltaserve-trimkv/1") {
        return invalid_argument(json_path + " is not a deltaserve TRIM-KV gates file");
    }
    if (j.value("model_id", "") != deltakv_model_id(config)) {
        return invalid_argument(json_path + " was trained for '" + j.value("model_id", "") + "', not this model ('" +
                                deltakv_model_id(config) + "')");
    }
    const std::string weights =
        (std::filesystem::path(json_path).parent_path() / j.value("weights", "trimkv.safetensors")).string();
    DS_ASSIGN_OR_RETURN(SafetensorsFile st, SafetensorsFile::open(weights));
    auto g = std::make_shared<kvstore::RetentionGates>();
    g->d_model = config.d_model;
    g->n_kv_heads = config.n_kv_heads;
    g->hidden = j.value("hidden", 0);
    const auto read = [&](int32_t layer, const char* name, std::vector<int64_t> shape,
                          std::vector<float>& out) -> Status {
        const std::string key = "layers." + std::to_string(layer) + ".gate." + name;
        const SafetensorsTensor* t = st.find(key);
        if (t == nullptr || t->dtype != "F32" || t->shape != shape) {
            return invalid_argument(weights + ": tensor " + key + " is missing or misshapen");
        }
        out.resize(t->n_bytes / sizeof(float));
        std::memcpy(out.data(), t->data, t->n_bytes);
        return Status();
    };
    const int64_t h = g->hidden, d = config.d_model, kv = config.n_kv_heads;
    for (int32_t l = 0; l < config.n_layers; ++l) {
        kvstore::RetentionGates::Layer w;
        DS_RETURN_IF_ERROR(read(l, "w1", {h, d}, w.w1));
        DS_RETURN_IF_ERROR(read(l, "b1", {h}, w.b1));
        DS_RETURN_IF_ERROR(read(l, "w2", {kv, h}, w.w2));
        DS_RETURN_IF_ERROR(read(l, "b2", {kv}, w.b2));
        g->layers.push_back(std::move(w));
    }
    return std::shared_ptr<const kvstore::RetentionGates>(std::move(g));
}

}  // namespace deltaserve::model
