// KV bytes shipped per prompt token: full KV against DeltaKV, as a prefill node would send
// them to a decode node. Each length is prefilled (chunks of 512) with each policy; the
// session's state and layers are exported and wrapped in wire-format shipments (header,
// ids and checksum included); the bytes are summed. Prints a table and, with --json, a
// summary. The decode side's exact reconstruction is tested in tests/model/kv_shipping_test.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "deltaserve/common/logging.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/transport/wire_format.h"

namespace {

using namespace deltaserve;

struct Shipped {
    size_t bytes = 0;
    size_t shipments = 0;
    double keep_ratio = 0;
};

Result<Shipped> ship(const model::Model& m, const std::string& policy, float keep,
                     const std::string& profile, std::span<const int32_t> tokens) {
    model::ContextOptions co;
    co.n_ctx = static_cast<int32_t>(tokens.size()) + 16;
    co.n_threads = 2;
    co.kv.policy = policy;
    co.kv.keep = keep;
    co.kv_profile = profile;
    DS_ASSIGN_OR_RETURN(auto ctx, model::InferenceContext::create(m, co));
    for (size_t at = 0; at < tokens.size(); at += 512) {
        DS_RETURN_IF_ERROR(
            ctx->eval(tokens.subspan(at, std::min<size_t>(512, tokens.size() - at))).status());
    }
    transport::ShipmentHeader h;
    h.codec = policy == "full" ? transport::KvCodec::kRawF16 : transport::KvCodec::kDeltaKv;
    h.n_layers = m.config.n_layers;
    h.token_end = static_cast<int32_t>(tokens.size());
    h.model_id = "SmolLM2-135M-Instruct.Q4_1";
    h.profile_id = policy == "full" ? "" : "deltakv-default";
    h.session_id = "bench-session-0001";
    Shipped out;
    out.keep_ratio = ctx->keep_ratio();
    DS_ASSIGN_OR_RETURN(auto state, ctx->export_kv_state());
    out.bytes += state.size();  // travels in the session's control message
    for (int32_t l = 0; l < m.config.n_layers; ++l) {
        DS_ASSIGN_OR_RETURN(auto part, ctx->export_kv_layer(l));
        h.layer = l;
        DS_ASSIGN_OR_RETURN(auto wire, transport::encode_shipment(h, part));
        out.bytes += wire.size();
        out.shipments++;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path, profile, text_path, json_path;
    std::vector<int> lengths = {2048, 4096, 8192};
    float keep = 0.3f;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
        if (a == "--model")
            model_path = next();
        else if (a == "--profile")
            profile = next();
        else if (a == "--text")
            text_path = next();
        else if (a == "--json")
            json_path = next();
        else if (a == "--keep")
            keep = std::stof(next());
        else if (a == "--lengths") {
            lengths.clear();
            std::stringstream s(next());
            for (std::string x; std::getline(s, x, ',');) lengths.push_back(std::stoi(x));
        } else {
            std::fprintf(stderr,
                         "usage: deltaserve-bench-shipping --model GGUF --profile JSON --text FILE "
                         "[--lengths 2048,4096,8192] [--keep 0.3] [--json FILE]\n");
            return 1;
        }
    }
    init_logging("warn");
    model::LoadOptions lo;
    lo.show_progress = false;
    auto m = model::load_model(model_path, lo);
    if (!m.ok()) return std::fprintf(stderr, "%s\n", m.error().to_string().c_str()), 2;
    std::ifstream in(text_path);
    std::stringstream text;
    text << in.rdbuf();
    auto tokens = (*m)->tokenizer->encode(text.str(), true, false);
    if (!tokens.ok()) return std::fprintf(stderr, "%s\n", tokens.error().to_string().c_str()), 2;

    nlohmann::json rows = nlohmann::json::array();
    std::printf("%8s %16s %16s %8s %10s\n", "tokens", "full B/token", "deltakv B/token", "ratio",
                "deltakv KR");
    for (int n : lengths) {
        if (static_cast<size_t>(n) > tokens->size()) {
            std::fprintf(stderr, "the text has only %zu tokens; skipping %d\n", tokens->size(), n);
            continue;
        }
        const std::span<const int32_t> prompt(tokens->data(), static_cast<size_t>(n));
        auto full = ship(**m, "full", 1.0f, profile, prompt);
        auto dkv = ship(**m, "deltakv", keep, profile, prompt);
        if (!full.ok() || !dkv.ok()) {
            std::fprintf(stderr, "%s\n",
                         (full.ok() ? dkv.error() : full.error()).to_string().c_str());
            return 2;
        }
        const double f = static_cast<double>(full->bytes) / n;
        const double d = static_cast<double>(dkv->bytes) / n;
        std::printf("%8d %16.1f %16.1f %8.3f %10.3f\n", n, f, d, d / f, dkv->keep_ratio);
        rows.push_back({{"tokens", n},
                        {"full_bytes", full->bytes},
                        {"deltakv_bytes", dkv->bytes},
                        {"full_bytes_per_token", f},
                        {"deltakv_bytes_per_token", d},
                        {"ratio", d / f},
                        {"deltakv_keep_ratio", dkv->keep_ratio},
                        {"shipments_per_session", dkv->shipments}});
    }
    if (!json_path.empty()) {
        std::ofstream(json_path) << nlohmann::json{{"keep", keep}, {"rows", rows}}.dump(2) << "\n";
    }
    return 0;
}
