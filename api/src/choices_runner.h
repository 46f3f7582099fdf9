// A request's n choices (ChatRequest::n), as vLLM's parallel sampling runs them: choice 0
// first; once its prompt's KV is in (TurnCallbacks::on_prompt_done, which comes after the
// decode node offered the prompt's blocks to its prefix cache) the others start together,
// each on its own thread, and adopt those blocks instead of computing the prompt again
// (all but its last partial block of kvstore::BlockPool::kBlockTokens tokens). Each choice
// samples with the request's seed plus its index. Without a prefix cache (a compressing KV
// policy) each choice computes the prompt.
#pragma once

#include <vector>

#include "deltaserve/api/chat_engine.h"

namespace deltaserve::api {

// The choices in order, or the first error among them (every started choice has ended by
// then). callbacks.wanted is asked by every choice; callbacks.on_piece and the others only
// by choice 0 of a request with n = 1 (n > 1 is not streamed).
Result<std::vector<TurnResult>> run_choices(ChatEngine& engine, const ChatRequest& request,
                                            const TurnCallbacks& callbacks);

}  // namespace deltaserve::api
