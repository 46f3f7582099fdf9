// Stored KV blocks (kvstore/kv_block.h), as the host and disk tiers read them back: any bytes
// parse or are refused with kDataLoss / kFailedPrecondition and a fault reason, never read
// past; a block that parses encodes back to the same bytes, and its parts lie inside it, and
// what deltactl reads of each part (kv_rows_info) is an answer or an error, its counts within
// the block's tokens. The
// first byte picks whether the expected fingerprint is the seeds' or another one.
// DELTASERVE_FUZZ_WRITE_SEEDS=DIR writes valid blocks to DIR (tests/fuzz/corpus/kv_block)
// and exits.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/chain_hash.h"
#include "deltaserve/kvstore/kv_block.h"
#include "deltaserve/kvstore/kv_rows_info.h"

using namespace deltaserve;
using kvstore::KvBlockFault;

namespace {

constexpr uint64_t kFingerprint = 0x5eed5eed12345678ull;

void check(std::span<const uint8_t> bytes, uint64_t fingerprint) {
    KvBlockFault fault = KvBlockFault::kNone;
    auto v = kvstore::parse_kv_block(bytes, fingerprint, &fault);
    if (!v.ok()) {
        const StatusCode c = v.status().code();
        if (fault == KvBlockFault::kNone ||
            (c != StatusCode::kDataLoss && c != StatusCode::kFailedPrecondition)) {
            std::abort();
        }
        return;
    }
    if (fault != KvBlockFault::kNone) std::abort();
    for (const auto& p : v->parts) {
        if (!p.empty() &&
            (p.data() < bytes.data() || p.data() + p.size() > bytes.data() + bytes.size())) {
            std::abort();
        }
    }
    const kvstore::KvBlockMeta& m = v->meta;
    for (int32_t l = 0; l < m.n_layers(); ++l) {
        auto info = kvstore::kv_rows_info(m.codec, m.codec_state, l, m.begin, m.end,
                                          v->parts[static_cast<size_t>(l)], true);
        if (info.ok() && info->kinds.size() != static_cast<size_t>(m.end - m.begin)) std::abort();
        if (info.ok() &&
            (info->sinks < 0 || info->references < 0 || info->latents < 0 || info->buffer < 0 ||
             info->dropped < 0 ||
             info->sinks + info->references + info->latents + info->buffer + info->dropped !=
                 m.end - m.begin ||
             info->exact_bytes + info->latent_bytes != v->parts[static_cast<size_t>(l)].size()))
            std::abort();
    }
    auto again = kvstore::encode_kv_block(v->meta, v->parts);
    if (!again.ok() || again->size() != bytes.size() ||
        !std::equal(again->begin(), again->end(), bytes.begin())) {
        std::abort();
    }
}

void write_seed(const std::string& path, std::span<const uint8_t> bytes) {
    std::ofstream out(path, std::ios::binary);
    out.put(0);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
}

void write_seeds(const std::string& dir) {
    kvstore::KvBlockMeta m;
    m.codec = kvstore::KvCodecId::kDeltaKv;
    m.fingerprint = kFingerprint;
    m.parent = kFingerprint;
    m.begin = 0;
    m.end = 16;
    for (int32_t i = 0; i < 16; ++i) m.tokens.push_back(i * 31);
    m.codec_state = {16, 0, 0, 0, 255, 255, 255, 255};
    m.layer_error = {0.0f, 0.02f};
    std::vector<uint8_t> a(48, 1), b(24, 2);
    const std::span<const uint8_t> parts[] = {a, b};
    write_seed(dir + "/deltakv-2-layers", *kvstore::encode_kv_block(m, parts));
    // A model with a window layer (0), a full one and a sparse one: the DeltaKV rows state's
    // roles (2 1 0), the window and the layer count; the window layer's part starts with the
    // first position it holds (8), its rows from there; the sparse layer's region is empty.
    const auto i32 = [](std::vector<uint8_t>& out, int32_t v) {
        for (int b = 0; b < 4; ++b) out.push_back(static_cast<uint8_t>(v >> (8 * b)));
    };
    m.codec_state.clear();
    for (int32_t v : {16, -1, 4, 2, 4, 8, 1}) i32(m.codec_state, v);
    m.codec_state.insert(m.codec_state.end(), {2, 1, 0});
    i32(m.codec_state, 8);
    i32(m.codec_state, 3);
    m.layer_error = {0.0f, 0.0f, 0.0f};
    std::vector<uint8_t> window;
    i32(window, 8);
    window.resize(4 + 2 * 8 * 2, 3);
    std::vector<uint8_t> sparse;
    i32(sparse, 4);
    sparse.resize(4 + 2 * 16 * 2, 4);
    std::vector<uint8_t> full(2 * 16 * 2, 5);
    const std::span<const uint8_t> three[] = {window, full, sparse};
    write_seed(dir + "/deltakv-window-layer", *kvstore::encode_kv_block(m, three));
    m.codec = kvstore::KvCodecId::kRows;
    m.parent = hash_tokens(kFingerprint, m.tokens);
    m.begin = 16;
    m.end = 17;
    m.tokens = {9};
    m.codec_state.clear();
    m.layer_error = {0.0f};
    const std::span<const uint8_t> one[] = {std::span<const uint8_t>()};
    write_seed(dir + "/rows-empty-part", *kvstore::encode_kv_block(m, one));
    std::fprintf(stderr, "wrote 3 seeds to %s\n", dir.c_str());
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
    check(std::span<const uint8_t>(data + 1, size - 1),
          data[0] & 1 ? kFingerprint + 1 : kFingerprint);
    return 0;
}
