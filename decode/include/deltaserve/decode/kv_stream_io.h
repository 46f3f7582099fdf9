// Sending a session's KV as a stream (transport/kv_stream.h) and taking it into a context:
// what the prefill worker ships and the decode worker receives, and the history a decode
// worker sends back when a prefill node pulls it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/transport/kv_stream.h"
#include "deltaserve/transport/transport.h"
#include "deltaserve/transport/wire_format.h"

namespace deltaserve::decode {

// What every shipment of a node's KV says it is (checked by the receiver).
struct KvStreamIds {
    std::string model_id;
    std::string profile_id;  // "" unless the policy needs a profile
    transport::KvCodec codec = transport::KvCodec::kRawF16;
};
// The codec of contexts made with these options.
transport::KvCodec kv_codec(const model::ContextOptions& options);

Status send_stream_message(transport::Connection& conn, const transport::StreamHeader& header,
                           std::span<const uint8_t> payload, transport::Deadline deadline);

// The data plane's handshake (transport/kv_stream.h, kChallenge / kProof). The side that
// was connected to sends a nonce and checks the answer: kUnauthenticated when the peer's
// proof of the cluster secret is missing or wrong (log it and close the connection). The
// connecting side answers before it sends anything else.
Status challenge_peer(transport::Connection& conn, const std::string& secret,
                      transport::Deadline deadline);
Status prove_to_peer(transport::Connection& conn, const std::string& secret,
                     transport::Deadline deadline);
// Best effort: tells the peer the turn's stream will not complete.
void send_abort(transport::Connection& conn, uint64_t turn, const std::string& why);
// One layer's part (or rows [begin, end) of it) as a kPart wire-format shipment.
Status send_part(transport::Connection& conn, uint64_t turn, const std::string& session,
                 const KvStreamIds& ids, int32_t layer, int32_t n_layers, int32_t begin,
                 int32_t end, std::span<const uint8_t> part, transport::Deadline deadline);
// A context's whole KV: kBegin with its state, every layer, kEnd with `token` and
// `end_message` (the first token's encoded log-probabilities, or "").
Status send_kv(transport::Connection& conn, const model::InferenceContext& ctx, uint64_t turn,
               const std::string& session, const KvStreamIds& ids, int32_t token,
               const std::string& end_message, transport::Deadline deadline);

// Takes a shipment into a context that imported the stream's state. covered[layer] counts
// the tokens of each layer taken so far: a layer comes whole or as rows in order.
// Errors: kInvalidArgument (another session, a range out of order), the import's errors.
Status import_part(model::InferenceContext& ctx, const transport::Shipment& shipment,
                   const std::string& session, std::vector<int32_t>& covered);
// kDataLoss unless every layer of ctx was taken in full.
Status check_complete(const model::InferenceContext& ctx, const std::vector<int32_t>& covered);

}  // namespace deltaserve::decode
