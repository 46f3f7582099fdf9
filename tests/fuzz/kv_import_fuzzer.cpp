// A decode node taking a session's KV from a peer: KV stream messages (kv_stream.h) carrying
// a cache state, wire-format shipments of layers or row ranges, and hints, imported into a
// fresh context as DecodeWorker does (decode/kv_stream_io.h), then decoded from. Any bytes
// are taken or refused with an error; what is taken decodes without reading out of bounds.
//
// Input: one byte choosing the cache (full f16 or f32, deltakv, deltakv keeping some tokens
// exact), then
// messages, each a u32 little-endian header length, the header, a u32 payload length and
// the payload. DELTASERVE_FUZZ_WRITE_SEEDS=DIR makes the harness write valid streams of
// every cache to DIR (tests/fuzz/corpus/kv_import) and exit.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/decode/kv_stream_io.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/transport/kv_stream.h"
#include "deltaserve/transport/wire_format.h"
#include "fuzz_support.h"

using namespace deltaserve;

namespace {

constexpr const char* kModelId = "tiny-3x16";
constexpr const char* kProfileId = "tiny-deltakv";
constexpr const char* kSession = "s";
constexpr int32_t kCtx = 256;

// The caches that ship between nodes (the eviction policies' do not yet).
struct Cache {
    const char* name;
    const char* policy;
    model::KvType type;
    float exact;  // deltakv: the share kept exact (--kv-exact)
};
constexpr Cache kCaches[] = {
    {"full", "full", model::KvType::kF16, 0.0f},
    {"full-f32", "full", model::KvType::kF32, 0.0f},
    {"deltakv", "deltakv", model::KvType::kF16, 0.0f},
    {"deltakv-exact", "deltakv", model::KvType::kF16, 0.05f},
};
constexpr size_t kNumCaches = sizeof(kCaches) / sizeof(kCaches[0]);

model::ContextOptions options(const Cache& c) {
    model::ContextOptions co;
    co.n_ctx = kCtx;
    co.n_threads = 1;
    co.n_batch = 64;
    co.kv_type = c.type;
    co.kv.policy = c.policy;
    co.kv.keep = std::string(c.policy) == "full" ? 1.0f : 0.5f;
    if (co.kv.policy == "deltakv") {
        co.deltakv_profile = fuzz::tiny_deltakv_profile();
        co.deltakv_exact = c.exact;
    }
    return co;
}

decode::KvStreamIds ids(const model::ContextOptions& co) {
    return {kModelId, co.kv.policy == "deltakv" ? kProfileId : "", decode::kv_codec(co)};
}

std::unique_ptr<model::InferenceContext> make_context(const Cache& c) {
    auto ctx = model::InferenceContext::create(fuzz::tiny_model(), options(c));
    if (!ctx.ok()) {
        std::fprintf(stderr, "context: %s\n", ctx.error().to_string().c_str());
        std::abort();
    }
    return std::move(*ctx);
}

// --- reading a stream --------------------------------------------------------------------

struct Reader {
    std::span<const uint8_t> in;
    std::span<const uint8_t> take() {
        if (in.size() < 4) {
            in = {};
            return {};
        }
        uint32_t n = 0;
        std::memcpy(&n, in.data(), 4);
        in = in.subspan(4);
        const size_t k = std::min<size_t>(n, in.size());
        auto out = in.first(k);
        in = in.subspan(k);
        return out;
    }
};

// What the decode node does with one connection's messages for one turn; returns when the
// turn is ready (and decodes from it), or at the first error, as the node would.
void receive(const Cache& cache, Reader r) {
    const model::ContextOptions co = options(cache);
    const decode::KvStreamIds id = ids(co);
    std::unique_ptr<model::InferenceContext> ctx;
    std::vector<int32_t> covered;
    while (!r.in.empty()) {
        const auto head = r.take();
        const auto payload = r.take();
        auto h = transport::decode_stream_header(std::span<const std::byte>(
            reinterpret_cast<const std::byte*>(head.data()), head.size()));
        if (!h.ok()) return;
        switch (h->kind) {
            case transport::StreamKind::kBegin:
                if (ctx || h->session != kSession) return;
                ctx = make_context(cache);
                if (!ctx->import_kv_state(payload).ok()) return;
                covered.assign(static_cast<size_t>(fuzz::tiny_model().config.n_layers), 0);
                break;
            case transport::StreamKind::kPart: {
                if (!ctx) break;
                auto s = transport::decode_shipment(payload, id.model_id, id.profile_id);
                if (!s.ok()) return;
                if (!decode::import_part(*ctx, *s, kSession, covered).ok()) return;
                break;
            }
            case transport::StreamKind::kEnd: {
                if (!ctx || !decode::check_complete(*ctx, covered).ok()) return;
                if (!ctx->import_kv_hints(payload).ok()) return;
                const int32_t n_vocab = fuzz::tiny_model().config.n_vocab;
                if (h->token < 0 || h->token >= n_vocab) return;
                // Decode a few steps from what was taken.
                int32_t token = h->token;
                for (int step = 0; step < 3 && ctx->n_past() < ctx->n_ctx(); ++step) {
                    auto logits = ctx->eval({&token, 1});
                    if (!logits.ok()) return;
                    if (logits->size() != static_cast<size_t>(n_vocab)) std::abort();
                    token = static_cast<int32_t>(step * 7 % n_vocab);
                }
                return;
            }
            case transport::StreamKind::kPull:
                break;
            default:  // kAbort; a handshake message inside a turn's stream
                return;
        }
    }
}

// --- writing seeds -----------------------------------------------------------------------

void put(std::vector<uint8_t>& out, std::span<const uint8_t> bytes) {
    const uint32_t n = static_cast<uint32_t>(bytes.size());
    const auto* p = reinterpret_cast<const uint8_t*>(&n);
    out.insert(out.end(), p, p + 4);
    out.insert(out.end(), bytes.begin(), bytes.end());
}

void put_message(std::vector<uint8_t>& out, const transport::StreamHeader& h,
                 std::span<const uint8_t> payload) {
    auto head = transport::encode_stream_header(h);
    if (!head.ok()) std::abort();
    put(out, std::span(reinterpret_cast<const uint8_t*>(head->data()), head->size()));
    put(out, payload);
}

void put_part(std::vector<uint8_t>& out, const decode::KvStreamIds& id, int32_t layer,
              int32_t begin, int32_t end, std::span<const uint8_t> part) {
    transport::ShipmentHeader sh;
    sh.codec = id.codec;
    sh.layer = layer;
    sh.n_layers = fuzz::tiny_model().config.n_layers;
    sh.token_begin = begin;
    sh.token_end = end;
    sh.model_id = id.model_id;
    sh.profile_id = id.profile_id;
    sh.session_id = kSession;
    auto bytes = transport::encode_shipment(sh, part);
    if (!bytes.ok()) std::abort();
    transport::StreamHeader h;
    h.kind = transport::StreamKind::kPart;
    h.turn = 1;
    put_message(out, h, *bytes);
}

std::vector<int32_t> prompt(int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 13 + 5) % 64;
    return t;
}

// The whole KV after the prefill, layer by layer (decode::send_kv).
std::vector<uint8_t> whole_layers_stream(size_t cache_index, int32_t n) {
    const Cache& cache = kCaches[cache_index];
    auto ctx = make_context(cache);
    const auto tokens = prompt(n);
    for (int32_t at = 0; at < n; at += 24) {
        const int32_t k = std::min(24, n - at);
        if (!ctx->eval(std::span(tokens).subspan(static_cast<size_t>(at), static_cast<size_t>(k)))
                 .ok())
            std::abort();
    }
    const auto id = ids(options(cache));
    std::vector<uint8_t> out{static_cast<uint8_t>(cache_index)};
    transport::StreamHeader h;
    h.kind = transport::StreamKind::kBegin;
    h.turn = 1;
    h.session = kSession;
    h.n_tokens = n;
    put_message(out, h, *ctx->export_kv_state());
    for (int32_t l = 0; l < ctx->model().config.n_layers; ++l) {
        put_part(out, id, l, 0, n, *ctx->export_kv_layer(l));
    }
    h.kind = transport::StreamKind::kEnd;
    h.token = 3;
    put_message(out, h, ctx->export_kv_hints());
    return out;
}

// Rows shipped while the prefill runs (the prefill worker's layer observer), chunk by chunk.
std::vector<uint8_t> rows_stream(size_t cache_index, int32_t n) {
    const Cache& cache = kCaches[cache_index];
    auto ctx = make_context(cache);
    if (!ctx->kv_ships_rows()) return {};
    const auto tokens = prompt(n);
    const auto id = ids(options(cache));
    std::vector<uint8_t> out{static_cast<uint8_t>(cache_index)};
    transport::StreamHeader h;
    h.kind = transport::StreamKind::kBegin;
    h.turn = 1;
    h.session = kSession;
    h.n_tokens = n;
    put_message(out, h, *ctx->export_kv_rows_state(n));
    const int32_t n_layers = ctx->model().config.n_layers;
    std::vector<int32_t> shipped(static_cast<size_t>(n_layers), 0);
    int32_t e = 0;
    bool done = false;
    const auto ship = [&](int32_t layer) {
        const int32_t end = done ? n : ctx->kv_rows_final_end(layer, e == n);
        int32_t& begin = shipped[static_cast<size_t>(layer)];
        if (end <= begin) return;
        put_part(out, id, layer, begin, end, *ctx->export_kv_rows(layer, begin, end));
        begin = end;
    };
    ctx->set_layer_observer([&](int32_t layer) {
        for (int32_t l = 0; l <= layer; ++l) ship(l);
    });
    for (int32_t b = 0; b < n; b = e) {
        e = std::min(n, b + 24);
        if (!ctx->eval(
                    std::span(tokens).subspan(static_cast<size_t>(b), static_cast<size_t>(e - b)))
                 .ok())
            std::abort();
    }
    ctx->set_layer_observer(nullptr);
    done = true;
    for (int32_t l = 0; l < n_layers; ++l) ship(l);
    h.kind = transport::StreamKind::kEnd;
    h.token = 3;
    put_message(out, h, ctx->export_kv_hints());
    return out;
}

void write_seeds(const std::string& dir) {
    int written = 0;
    for (size_t i = 0; i < kNumCaches; ++i) {
        const std::string name = kCaches[i].name;
        for (const auto& [kind, bytes] : {std::pair{"layers", whole_layers_stream(i, 40)},
                                          std::pair{"rows", rows_stream(i, 40)}}) {
            if (bytes.empty()) continue;
            std::ofstream(dir + "/" + name + "-" + kind, std::ios::binary)
                .write(reinterpret_cast<const char*>(bytes.data()),
                       static_cast<std::streamsize>(bytes.size()));
            ++written;
        }
    }
    std::fprintf(stderr, "wrote %d seeds to %s\n", written, dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    fuzz::quiet_logs();
    (void)fuzz::tiny_model();
    if (const char* dir = std::getenv("DELTASERVE_FUZZ_WRITE_SEEDS")) {
        write_seeds(dir);
        std::exit(0);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    receive(kCaches[data[0] % kNumCaches], Reader{std::span(data + 1, size - 1)});
    return 0;
}
