#include "deltaserve/transport/wire_format.h"

#include <array>
#include <cstring>

namespace deltaserve::transport {

namespace {

constexpr uint8_t kMagic[4] = {'D', 'S', 'K', 'V'};
constexpr size_t kFixedBytes = 32;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
    for (size_t i = 0; i < sizeof(T); ++i)
        out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
}

// Reads little-endian values from a span, failing (not reading) past its end.
class Reader {
  public:
    explicit Reader(std::span<const uint8_t> b) : b_(b) {}
    template <typename T>
    bool get(T& v) {
        if (b_.size() - at_ < sizeof(T)) return false;
        uint64_t x = 0;
        for (size_t i = 0; i < sizeof(T); ++i) x |= static_cast<uint64_t>(b_[at_ + i]) << (8 * i);
        v = static_cast<T>(x);
        at_ += sizeof(T);
        return true;
    }
    bool get_string(std::string& s) {
        uint16_t n = 0;
        if (!get(n) || b_.size() - at_ < n) return false;
        s.assign(reinterpret_cast<const char*>(b_.data() + at_), n);
        at_ += n;
        return true;
    }
    size_t at() const { return at_; }
    size_t left() const { return b_.size() - at_; }

  private:
    std::span<const uint8_t> b_;
    size_t at_ = 0;
};

Status check_header(const ShipmentHeader& h) {
    if (h.codec != KvCodec::kRawF16 && h.codec != KvCodec::kRawF32 &&
        h.codec != KvCodec::kDeltaKv) {
        return invalid_argument("unknown KV codec " + std::to_string(static_cast<int>(h.codec)));
    }
    if (h.n_layers < 1 || h.layer < 0 || h.layer >= h.n_layers) {
        return invalid_argument("layer " + std::to_string(h.layer) + " of " +
                                std::to_string(h.n_layers) + " is not a layer");
    }
    if (h.token_begin < 0 || h.token_end < h.token_begin) {
        return invalid_argument("token range [" + std::to_string(h.token_begin) + ", " +
                                std::to_string(h.token_end) + ") is not a range");
    }
    return Status();
}

}  // namespace

Result<std::vector<uint8_t>> encode_shipment(const ShipmentHeader& h,
                                             std::span<const uint8_t> payload) {
    DS_RETURN_IF_ERROR(check_header(h));
    for (const std::string* id : {&h.model_id, &h.profile_id, &h.session_id}) {
        if (id->size() > kMaxIdBytes)
            return invalid_argument("an id is longer than " + std::to_string(kMaxIdBytes));
    }
    std::vector<uint8_t> out;
    out.reserve(kFixedBytes + 12 + h.model_id.size() + h.profile_id.size() + h.session_id.size() +
                payload.size());
    out.insert(out.end(), kMagic, kMagic + 4);
    put<uint16_t>(out, kWireVersion);
    put<uint8_t>(out, static_cast<uint8_t>(h.codec));
    put<uint8_t>(out, 0);
    put<int32_t>(out, h.layer);
    put<int32_t>(out, h.n_layers);
    put<int32_t>(out, h.token_begin);
    put<int32_t>(out, h.token_end);
    put<uint64_t>(out, payload.size());
    for (const std::string* id : {&h.model_id, &h.profile_id, &h.session_id}) {
        put<uint16_t>(out, static_cast<uint16_t>(id->size()));
        out.insert(out.end(), id->begin(), id->end());
    }
    put<uint32_t>(out, crc32c(payload, crc32c(out)));
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

Result<Shipment> decode_shipment(std::span<const uint8_t> bytes, std::string_view expect_model_id,
                                 std::string_view expect_profile_id) {
    if (bytes.size() < kFixedBytes) {
        return data_loss("a KV shipment of " + std::to_string(bytes.size()) +
                         " bytes is shorter than its header");
    }
    if (std::memcmp(bytes.data(), kMagic, 4) != 0)
        return invalid_argument("not a KV shipment (bad magic)");
    Reader r(bytes.subspan(4));
    uint16_t version = 0;
    uint8_t codec = 0, flags = 0;
    uint64_t payload_bytes = 0;
    Shipment s;
    ShipmentHeader& h = s.header;
    r.get(version);
    if (version != kWireVersion) {
        return invalid_argument("KV shipment version " + std::to_string(version) +
                                "; this build reads version " + std::to_string(kWireVersion));
    }
    r.get(codec);
    r.get(flags);
    r.get(h.layer);
    r.get(h.n_layers);
    r.get(h.token_begin);
    r.get(h.token_end);
    r.get(payload_bytes);
    h.codec = static_cast<KvCodec>(codec);
    if (!r.get_string(h.model_id) || !r.get_string(h.profile_id) || !r.get_string(h.session_id)) {
        return data_loss("the KV shipment's header is cut short");
    }
    const size_t header_end = 4 + r.at();
    uint32_t crc = 0;
    if (!r.get(crc)) return data_loss("the KV shipment's header is cut short");
    if (r.left() != payload_bytes) {
        return data_loss("the KV shipment says " + std::to_string(payload_bytes) +
                         " payload bytes, " + std::to_string(r.left()) + " arrived");
    }
    s.payload = bytes.subspan(bytes.size() - payload_bytes);
    if (crc32c(s.payload, crc32c(bytes.first(header_end))) != crc) {
        return data_loss("the KV shipment's checksum does not match (corrupted in transit)");
    }
    if (flags != 0) return invalid_argument("the KV shipment sets unknown flags");
    DS_RETURN_IF_ERROR(check_header(h));
    if (!expect_model_id.empty() && h.model_id != expect_model_id) {
        return failed_precondition("the KV shipment is for model '" + h.model_id +
                                   "', this node serves '" + std::string(expect_model_id) + "'");
    }
    if (!expect_profile_id.empty() && h.profile_id != expect_profile_id) {
        return failed_precondition("the KV shipment uses compression profile '" + h.profile_id +
                                   "', this node has '" + std::string(expect_profile_id) + "'");
    }
    return s;
}

}  // namespace deltaserve::transport
