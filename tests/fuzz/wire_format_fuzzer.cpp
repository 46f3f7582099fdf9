// The KV data plane's framing: KV shipments (wire_format.h) and KV stream message headers
// (kv_stream.h), with a kEnd's first-token log-probabilities. Any bytes decode or are refused with
// kDataLoss / kInvalidArgument / kFailedPrecondition, never read past; what decodes encodes back to
// the same bytes. The first byte picks the decoder (even: shipment, odd: stream header) and, for
// shipments, whether the expected model and profile ids are checked.
// DELTASERVE_FUZZ_WRITE_SEEDS=DIR writes valid shipments and stream headers to DIR
// (tests/fuzz/corpus/wire_format) and exits.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/model/token_logprobs.h"
#include "deltaserve/transport/kv_stream.h"
#include "deltaserve/transport/wire_format.h"

using namespace deltaserve;

namespace {

constexpr int32_t kVocab = 49152;

void expect_refusal(const Status& s) {
    switch (s.code()) {
        case StatusCode::kDataLoss:
        case StatusCode::kInvalidArgument:
        case StatusCode::kFailedPrecondition:
            return;
        default:
            std::abort();
    }
}

void shipment(std::span<const uint8_t> bytes, bool expect_ids) {
    auto s = expect_ids ? transport::decode_shipment(bytes, "llama-30x576-kv3x64", "deltakv-ab12")
                        : transport::decode_shipment(bytes, "", "");
    if (!s.ok()) return expect_refusal(s.status());
    if (s->payload.data() < bytes.data() ||
        s->payload.data() + s->payload.size() > bytes.data() + bytes.size()) {
        std::abort();
    }
    auto again = transport::encode_shipment(s->header, s->payload);
    if (!again.ok() || again->size() != bytes.size() ||
        !std::equal(again->begin(), again->end(), bytes.begin())) {
        std::abort();
    }
}

void stream_header(std::span<const uint8_t> bytes) {
    const std::span<const std::byte> b(reinterpret_cast<const std::byte*>(bytes.data()),
                                       bytes.size());
    auto h = transport::decode_stream_header(b);
    if (!h.ok()) return expect_refusal(h.status());
    auto again = transport::encode_stream_header(*h);
    if (!again.ok() || again->size() != b.size() ||
        !std::equal(again->begin(), again->end(), b.begin())) {
        std::abort();
    }
    // A kEnd's message: the first token's log-probabilities, when the turn asked for them.
    if (h->kind == transport::StreamKind::kEnd && !h->message.empty()) {
        auto lp = model::decode_token_logprobs(h->message, kVocab);
        if (!lp.ok()) return expect_refusal(lp.status());
        if (model::encode_token_logprobs(*lp) != h->message) std::abort();
    }
}

void write_seed(const std::string& path, uint8_t selector, std::span<const uint8_t> bytes) {
    std::ofstream out(path, std::ios::binary);
    out.put(static_cast<char>(selector));
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
}

void write_seeds(const std::string& dir) {
    transport::ShipmentHeader sh;
    sh.codec = transport::KvCodec::kDeltaKv;
    sh.layer = 7;
    sh.n_layers = 30;
    sh.token_begin = 512;
    sh.token_end = 1024;
    sh.model_id = "llama-30x576-kv3x64";
    sh.profile_id = "deltakv-ab12";
    sh.session_id = "chat-42";
    std::vector<uint8_t> payload(64);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
    write_seed(dir + "/shipment-deltakv", 2, *transport::encode_shipment(sh, payload));
    sh.codec = transport::KvCodec::kRawF16;
    sh.profile_id.clear();
    sh.layer = 0;
    sh.token_begin = 0;
    write_seed(dir + "/shipment-f16-empty", 0, *transport::encode_shipment(sh, {}));
    transport::StreamHeader h;
    h.kind = transport::StreamKind::kBegin;
    h.turn = 0x1234567890ULL;
    h.n_tokens = 4096;
    h.session = "chat-42";
    auto bytes = *transport::encode_stream_header(h);
    write_seed(dir + "/stream-begin", 1,
               std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    h.kind = transport::StreamKind::kAbort;
    h.message = "the prefill node stopped";
    bytes = *transport::encode_stream_header(h);
    write_seed(dir + "/stream-abort", 1,
               std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    h.kind = transport::StreamKind::kEnd;
    h.token = 42;
    std::vector<float> logits(kVocab);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 97) * 0.1f;
    h.message = model::encode_token_logprobs(model::token_logprobs(logits, 42, 5));
    bytes = *transport::encode_stream_header(h);
    write_seed(dir + "/stream-end-logprobs", 1,
               std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    std::fprintf(stderr, "wrote 5 seeds to %s\n", dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    if (const char* dir = std::getenv("DELTASERVE_FUZZ_WRITE_SEEDS")) {
        write_seeds(dir);
        std::exit(0);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::span<const uint8_t> rest(data + 1, size - 1);
    if (data[0] & 1) {
        stream_header(rest);
    } else {
        shipment(rest, (data[0] & 2) != 0);
    }
    return 0;
}
