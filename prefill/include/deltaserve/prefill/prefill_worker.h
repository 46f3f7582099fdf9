// The prefill worker (DESIGN.md "One chat turn", steps 3 and 4): computes a turn's KV and
// ships it to the decode node that will generate, then samples the first token.
//
// For a later turn it first pulls the session's cached history from the decode node (a
// kPull on the data connection) so that the new tokens attend to all of it. It prefills in
// chunks of n_batch tokens. Where the cache's rows are final once a layer stored them (full
// KV), each layer's rows of each chunk are shipped from the layer observer while the next
// layers compute; a compressing cache (DeltaKV) compresses at the end of a chunk, across
// layers, so its layers are shipped one after another once the last chunk is done. One
// request runs at a time; others queue in the order they came, and a cancelled one leaves
// the queue at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/decode/turn.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "deltaserve/transport/transport.h"

namespace deltaserve::prefill {

struct PrefillOptions {
    model::ContextOptions context;  // as the decode nodes make theirs
    std::string model_id;
    std::string profile_id;
    int64_t transfer_timeout_ms =
        60'000;  // a decode node that takes nothing for this long fails the turn
    int64_t connect_timeout_ms = 10'000;
    std::string cluster_token;  // proved to decode nodes on each data connection; "" = none
};

struct PrefillRequest {
    decode::TurnSpec turn;       // turn id, session, the whole prompt, sampling
    std::string decode_address;  // the decode node's data address
    int32_t pull_tokens = 0;     // the session's cached tokens to pull from it first
};

struct PrefillResult {
    int32_t first_token = -1;
    int32_t pulled_tokens = 0;     // history taken from the decode node
    int32_t prefilled_tokens = 0;  // computed here
    int64_t bytes_shipped = 0;
    double seconds = 0;
};

struct PrefillStats {
    int64_t queued = 0;  // requests waiting or running
    int64_t requests = 0;
    int64_t failures = 0;  // not counting the cancelled
    int64_t tokens = 0;    // prefilled
    int64_t bytes_shipped = 0;
};

class PrefillWorker {
  public:
    // The transport connects to decode nodes (the same one they listen on, in one process).
    // Errors: kInvalidArgument for options the model cannot take.
    static Result<std::unique_ptr<PrefillWorker>> create(const model::Model& model,
                                                         PrefillOptions options,
                                                         transport::Transport& transport);
    virtual ~PrefillWorker() = default;

    // Prefills the turn's prompt and ships its KV to the decode node, ending the stream with
    // the first token. On failure the decode node is told (kAbort) and the error returned:
    // kUnavailable (the decode node is unreachable or died), kDeadlineExceeded, kOutOfRange
    // (the prompt does not fit), kInvalidArgument.
    virtual Result<PrefillResult> prefill(const PrefillRequest& request) = 0;
    // The prefill of this turn, queued or running, stops: a queued one before it starts, a
    // running one after its current chunk; the decode node is told (kAbort) and prefill()
    // returns kFailedPrecondition. A turn not here (done, or never sent) is ignored.
    virtual void cancel(uint64_t turn_id) = 0;
    virtual PrefillStats stats() const = 0;
};

}  // namespace deltaserve::prefill
