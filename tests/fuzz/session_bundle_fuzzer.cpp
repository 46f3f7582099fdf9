// A session bundle (decode/session_bundle.h) as deltactl import reads it: any bytes parse or
// are refused with kDataLoss, never read past; a bundle that parses names exactly the blocks
// its record does, in order, and encodes back to bytes that parse the same. The harness
// rewrites each input's trailing CRC so that mutations reach the parsers behind the checksum
// (the checksum itself: tests/ops/bundle_test.cpp).
// DELTASERVE_FUZZ_WRITE_SEEDS=DIR writes a valid bundle to DIR
// (tests/fuzz/corpus/session_bundle) and exits.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/chain_hash.h"
#include "deltaserve/common/crc32c.h"
#include "deltaserve/decode/session_bundle.h"
#include "deltaserve/kvstore/kv_block.h"

using namespace deltaserve;
namespace d = deltaserve::decode;

namespace {

constexpr uint64_t kFingerprint = 0x5eed5eed87654321ull;

void write_seeds(const std::string& dir) {
    d::SessionBundle b;
    b.session = "/ada";
    b.fingerprint = kFingerprint;
    b.gateway_record = R"({"v":1,"id":"ada"})";
    uint64_t parent = hash_string(kFingerprint, "session:/ada");
    for (int32_t blk = 0; blk < 2; ++blk) {
        kvstore::KvBlockMeta m;
        m.codec = kvstore::KvCodecId::kRows;
        m.fingerprint = kFingerprint;
        m.parent = parent;
        m.begin = 4 * blk;
        m.end = m.begin + 4;
        for (int32_t i = 0; i < 4; ++i) m.tokens.push_back(m.begin + i);
        m.codec_state = {8, 0, 0, 0, 8, 0, 0, 0};
        m.layer_error = {std::numeric_limits<float>::quiet_NaN()};
        std::vector<uint8_t> part(64, static_cast<uint8_t>(blk));
        const std::span<const uint8_t> parts[] = {part};
        auto bytes = *kvstore::encode_kv_block(m, parts);
        parent = hash_tokens(parent, m.tokens);
        b.record.keys.push_back(parent);
        b.record.ends.push_back(m.end);
        b.record.crcs.push_back(crc32c(bytes));
        b.blocks.emplace_back(parent, std::move(bytes));
    }
    b.record.tokens = {0, 1, 2, 3, 4, 5, 6, 7};
    b.record.turn_ends = {5, 8};
    const auto file = d::encode_session_bundle(b);
    std::ofstream out(dir + "/two-blocks", std::ios::binary);
    out.write(reinterpret_cast<const char*>(file.data()),
              static_cast<std::streamsize>(file.size()));
    std::fprintf(stderr, "wrote 1 seed to %s\n", dir.c_str());
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
    std::vector<uint8_t> bytes(data, data + size);
    if (size >= 8) {
        const uint32_t crc = crc32c(std::span<const uint8_t>(bytes.data(), size - 4));
        std::memcpy(bytes.data() + size - 4, &crc, 4);
    }
    auto b = d::decode_session_bundle(bytes);
    if (!b.ok()) {
        if (b.status().code() != StatusCode::kDataLoss) std::abort();
        return 0;
    }
    if (b->blocks.size() != b->record.keys.size()) std::abort();
    for (size_t i = 0; i < b->blocks.size(); ++i) {
        if (b->blocks[i].first != b->record.keys[i]) std::abort();
    }
    auto twice = d::decode_session_bundle(d::encode_session_bundle(*b));
    if (!twice.ok() || twice->blocks != b->blocks || twice->session != b->session ||
        twice->gateway_record != b->gateway_record || twice->record.tokens != b->record.tokens)
        std::abort();
    return 0;
}
