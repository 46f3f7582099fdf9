// KV bytes shipped per prompt token: full KV against DeltaKV, as a prefill node sends them
// to a decode node. Each length is prefilled (chunks of 512) with each policy; from the
// layer observer, each layer's rows are exported once final and wrapped in wire-format
// shipments (header, ids and checksum included); the bytes are summed, and the share sent
// while the prefill still had layers to compute (everything but the last layer's rows of
// the last chunk) is the overlap of transfer with compute. Prints a table and, with --json,
// a summary. The decode side's exact reconstruction is tested in
// tests/model/kv_shipping_test.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "deltaserve/common/logging.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/transport/wire_format.h"

namespace {

using namespace deltaserve;

struct Shipped {
    size_t bytes = 0;
    size_t early = 0;  // sent while the prefill still had layers to compute
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
    const int32_t n = static_cast<int32_t>(tokens.size()), n_layers = m.config.n_layers;
    transport::ShipmentHeader h;
    DS_ASSIGN_OR_RETURN(const kvstore::KvPolicyInfo* info, kvstore::find_kv_policy(policy));
    const bool rows = info->codec == kvstore::KvCodecId::kRows;
    h.codec = rows ? transport::KvCodec::kRawF16 : transport::KvCodec::kDeltaKv;
    h.n_layers = n_layers;
    h.model_id = "SmolLM2-135M-Instruct.Q4_1";
    h.profile_id = rows ? "" : "deltakv-default";
    h.session_id = "bench-session-0001";
    Shipped out;
    DS_ASSIGN_OR_RETURN(auto state, ctx->export_kv_rows_state(n));
    out.bytes += state.size();  // travels in the stream's begin message
    out.early += state.size();
    // As the prefill worker ships: from the layer observer, each layer's rows once final.
    std::vector<int32_t> shipped(static_cast<size_t>(n_layers), 0);
    int32_t e = 0;
    bool done = false;     // after the last chunk: every row left
    int32_t at_layer = 0;  // the layer whose observer ships
    Status failed;
    const auto ship = [&](int32_t layer) {
        const int32_t end = done ? n : ctx->kv_rows_final_end(layer, e == n);
        int32_t& begin = shipped[static_cast<size_t>(layer)];
        if (end <= begin || !failed.ok()) return;
        auto rows = ctx->export_kv_rows(layer, begin, end);
        h.layer = layer;
        h.token_begin = begin;
        h.token_end = end;
        auto wire = rows.ok() ? transport::encode_shipment(h, *rows)
                              : Result<std::vector<uint8_t>>(rows.error());
        if (!wire.ok()) {
            failed = wire.error();
            return;
        }
        out.bytes += wire->size();
        if (!done && (e < n || at_layer + 1 < n_layers)) out.early += wire->size();
        out.shipments++;
        begin = end;
    };
    // A layer's rows may become final at a later layer (DeltaKV keeping tokens exact).
    ctx->set_layer_observer([&](int32_t layer) {
        at_layer = layer;
        for (int32_t l = 0; l <= layer; ++l) ship(l);
    });
    for (int32_t b = 0; b < n; b = e) {
        e = std::min(n, b + 512);
        DS_RETURN_IF_ERROR(
            ctx->eval(tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(e - b))).status());
        DS_RETURN_IF_ERROR(failed);
    }
    ctx->set_layer_observer(nullptr);
    done = true;
    for (int32_t l = 0; l < n_layers; ++l) ship(l);
    DS_RETURN_IF_ERROR(failed);
    out.keep_ratio = ctx->keep_ratio();
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
    std::printf("%8s %16s %16s %8s %10s %12s %15s\n", "tokens", "full B/token", "deltakv B/token",
                "ratio", "deltakv KR", "full early", "deltakv early");
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
        const double fe = static_cast<double>(full->early) / static_cast<double>(full->bytes);
        const double de = static_cast<double>(dkv->early) / static_cast<double>(dkv->bytes);
        std::printf("%8d %16.1f %16.1f %8.3f %10.3f %12.3f %15.3f\n", n, f, d, d / f,
                    dkv->keep_ratio, fe, de);
        rows.push_back({{"tokens", n},
                        {"full_bytes", full->bytes},
                        {"deltakv_bytes", dkv->bytes},
                        {"full_bytes_per_token", f},
                        {"deltakv_bytes_per_token", d},
                        {"ratio", d / f},
                        {"deltakv_keep_ratio", dkv->keep_ratio},
                        {"full_early_share", fe},
                        {"deltakv_early_share", de},
                        {"deltakv_shipments_per_session", dkv->shipments}});
    }
    if (!json_path.empty()) {
        std::ofstream(json_path) << nlohmann::json{{"keep", keep}, {"rows", rows}}.dump(2) << "\n";
    }
    return 0;
}
