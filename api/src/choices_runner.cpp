#include "choices_runner.h"

#include <mutex>
#include <optional>
#include <thread>

namespace deltaserve::api {

Result<std::vector<TurnResult>> run_choices(ChatEngine& engine, const ChatRequest& request,
                                            const TurnCallbacks& callbacks) {
    if (request.n <= 1) {
        DS_ASSIGN_OR_RETURN(TurnResult r, engine.run_turn(request, callbacks));
        return std::vector<TurnResult>{std::move(r)};
    }
    const size_t n = static_cast<size_t>(request.n);
    std::vector<std::optional<Result<TurnResult>>> results(n);
    std::vector<std::thread> others;
    std::mutex mu;  // others, started
    bool started = false;
    const auto start_others = [&] {
        std::lock_guard<std::mutex> lock(mu);
        if (std::exchange(started, true)) return;
        for (size_t i = 1; i < n; ++i) {
            others.emplace_back([&, i] {
                ChatRequest choice = request;
                choice.sampling.seed = request.sampling.seed + i;
                choice.prompt_logprobs = -1;  // choice 0 reports the prompt's
                TurnCallbacks quiet;
                quiet.on_piece = [&](std::string_view) {
                    return !callbacks.wanted || callbacks.wanted();
                };
                quiet.wanted = callbacks.wanted;
                results[i].emplace(engine.run_turn(choice, quiet));
            });
        }
    };
    TurnCallbacks first;
    first.on_piece = [&](std::string_view) { return !callbacks.wanted || callbacks.wanted(); };
    first.wanted = callbacks.wanted;
    first.on_prompt_done = start_others;
    results[0].emplace(engine.run_turn(request, first));
    // A choice 0 that failed before its prompt was in: the others are not run.
    if (results[0]->ok()) start_others();
    {
        std::lock_guard<std::mutex> lock(mu);
        started = true;  // no more threads from here
    }
    for (std::thread& t : others) t.join();
    std::vector<TurnResult> out;
    for (auto& r : results) {
        if (!r) continue;
        if (!r->ok()) return r->status();
        out.push_back(std::move(**r));
    }
    return out;
}

}  // namespace deltaserve::api
