#include "deltaserve/decode/kv_stream_io.h"

#include <cstring>

#include "deltaserve/common/logging.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/transport/peer_auth.h"

namespace deltaserve::decode {

namespace {
using transport::StreamHeader;
using transport::StreamKind;
}  // namespace

transport::KvCodec kv_codec(const model::ContextOptions& options) {
    auto policy = kvstore::find_kv_policy(options.kv.policy);
    if (policy.ok() && (*policy)->codec == kvstore::KvCodecId::kDeltaKv)
        return transport::KvCodec::kDeltaKv;
    return options.kv_type == model::KvType::kF32 ? transport::KvCodec::kRawF32
                                                  : transport::KvCodec::kRawF16;
}

Status send_stream_message(transport::Connection& conn, const StreamHeader& header,
                           std::span<const uint8_t> payload, transport::Deadline deadline) {
    DS_ASSIGN_OR_RETURN(auto head, transport::encode_stream_header(header));
    transport::Message m;
    m.header = std::move(head);
    m.payload = conn.allocate_payload(payload.size());
    if (!payload.empty()) std::memcpy(m.payload.data(), payload.data(), payload.size());
    return conn.send(std::move(m), deadline);
}

Status challenge_peer(transport::Connection& conn, const std::string& secret,
                      transport::Deadline deadline) {
    StreamHeader h;
    h.kind = StreamKind::kChallenge;
    h.message = transport::make_nonce();
    DS_RETURN_IF_ERROR(send_stream_message(conn, h, {}, deadline));
    DS_ASSIGN_OR_RETURN(auto m, conn.receive(deadline));
    auto r = transport::decode_stream_header(m.header);
    if (!r.ok() || r->kind != StreamKind::kProof || !m.payload.empty() ||
        !transport::verify(secret, "kv", h.message, r->message)) {
        return unauthenticated("the peer did not prove the cluster token");
    }
    return Status();
}

Status prove_to_peer(transport::Connection& conn, const std::string& secret,
                     transport::Deadline deadline) {
    DS_ASSIGN_OR_RETURN(auto m, conn.receive(deadline));
    DS_ASSIGN_OR_RETURN(auto r, transport::decode_stream_header(m.header));
    if (r.kind != StreamKind::kChallenge || r.message.size() != 64) {
        return data_loss("the peer did not open with a challenge (an older deltaserve?)");
    }
    StreamHeader h;
    h.kind = StreamKind::kProof;
    h.message = transport::prove(secret, "kv", r.message);
    return send_stream_message(conn, h, {}, deadline);
}

void send_abort(transport::Connection& conn, uint64_t turn, const std::string& why) {
    StreamHeader h;
    h.kind = StreamKind::kAbort;
    h.turn = turn;
    h.message = why.substr(0, 1024);
    Status st = send_stream_message(conn, h, {}, transport::deadline_in(std::chrono::seconds(2)));
    if (!st.ok())
        spdlog::debug("kv stream: the abort of turn {} was not sent: {}", turn, st.message());
}

Status send_part(transport::Connection& conn, uint64_t turn, const std::string& session,
                 const KvStreamIds& ids, int32_t layer, int32_t n_layers, int32_t begin,
                 int32_t end, std::span<const uint8_t> part, transport::Deadline deadline) {
    transport::ShipmentHeader sh;
    sh.codec = ids.codec;
    sh.layer = layer;
    sh.n_layers = n_layers;
    sh.token_begin = begin;
    sh.token_end = end;
    sh.model_id = ids.model_id;
    sh.profile_id = ids.profile_id;
    sh.session_id = session;
    DS_ASSIGN_OR_RETURN(auto bytes, transport::encode_shipment(sh, part));
    StreamHeader h;
    h.kind = StreamKind::kPart;
    h.turn = turn;
    return send_stream_message(conn, h, bytes, deadline);
}

Status send_kv(transport::Connection& conn, const model::InferenceContext& ctx, uint64_t turn,
               const std::string& session, const KvStreamIds& ids, int32_t token,
               const std::string& end_message, transport::Deadline deadline) {
    const int32_t n_layers = ctx.model().config.n_layers;
    const int32_t n = ctx.n_past();
    DS_ASSIGN_OR_RETURN(auto state, ctx.export_kv_state());
    StreamHeader h;
    h.kind = StreamKind::kBegin;
    h.turn = turn;
    h.session = session;
    h.n_tokens = n;
    DS_RETURN_IF_ERROR(send_stream_message(conn, h, state, deadline));
    for (int32_t l = 0; l < n_layers; ++l) {
        DS_ASSIGN_OR_RETURN(auto part, ctx.export_kv_layer(l));
        DS_RETURN_IF_ERROR(send_part(conn, turn, session, ids, l, n_layers, 0, n, part, deadline));
    }
    h.kind = StreamKind::kEnd;
    h.token = token;
    h.message = end_message;
    return send_stream_message(conn, h, ctx.export_kv_hints(), deadline);
}

Status import_part(model::InferenceContext& ctx, const transport::Shipment& s,
                   const std::string& session, std::vector<int32_t>& covered) {
    const auto& h = s.header;
    const int32_t n = ctx.n_past();
    if (h.session_id != session) {
        return invalid_argument("a KV shipment for session '" + h.session_id +
                                "' in the stream of '" + session + "'");
    }
    if (h.n_layers != static_cast<int32_t>(covered.size()) || h.layer >= h.n_layers) {
        return invalid_argument("a KV shipment for layer " + std::to_string(h.layer) + " of " +
                                std::to_string(h.n_layers) + "; the model has " +
                                std::to_string(covered.size()));
    }
    int32_t& got = covered[static_cast<size_t>(h.layer)];
    if (h.token_begin != got || h.token_end > n) {
        return invalid_argument("layer " + std::to_string(h.layer) + " rows [" +
                                std::to_string(h.token_begin) + ", " + std::to_string(h.token_end) +
                                ") arrived out of order (" + std::to_string(got) + " of " +
                                std::to_string(n) + " taken)");
    }
    if (h.token_begin == 0 && h.token_end == n) {
        DS_RETURN_IF_ERROR(ctx.import_kv_layer(h.layer, s.payload));
    } else {
        DS_RETURN_IF_ERROR(ctx.import_kv_rows(h.layer, h.token_begin, h.token_end, s.payload));
    }
    got = h.token_end;
    return {};
}

Status check_complete(const model::InferenceContext& ctx, const std::vector<int32_t>& covered) {
    for (size_t l = 0; l < covered.size(); ++l) {
        if (covered[l] != ctx.n_past()) {
            return data_loss("the KV stream ended with layer " + std::to_string(l) + " at " +
                             std::to_string(covered[l]) + " of " + std::to_string(ctx.n_past()) +
                             " tokens");
        }
    }
    return {};
}

}  // namespace deltaserve::decode
