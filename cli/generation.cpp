#include "generation.h"

#include <chrono>

#include "deltaserve/common/logging.h"

namespace deltaserve::cli {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Result<GenerationStats> generate_tokens(model::InferenceContext& ctx, model::Sampler& sampler,
                                        std::span<const int32_t> input, int32_t max_tokens,
                                        const std::function<void(int32_t)>& on_token) {
    const model::Tokenizer& tok = *ctx.model().tokenizer;
    GenerationStats st;
    for (int32_t t : input) sampler.accept(t);
    auto t0 = std::chrono::steady_clock::now();
    DS_ASSIGN_OR_RETURN(std::span<const float> logits, ctx.eval(input));
    st.prefill_seconds = seconds_since(t0);
    st.n_prefilled = static_cast<int32_t>(input.size());
    t0 = std::chrono::steady_clock::now();
    while (max_tokens < 0 || static_cast<int32_t>(st.generated.size()) < max_tokens) {
        const int32_t next = sampler.sample(logits);
        if (tok.is_eog(next)) {
            st.stopped_at_eog = true;
            break;
        }
        st.generated.push_back(next);
        sampler.accept_generated(next);
        on_token(next);
        if (max_tokens >= 0 && static_cast<int32_t>(st.generated.size()) == max_tokens) break;
        if (ctx.n_past() >= ctx.n_ctx()) {
            st.stopped_at_context = true;
            spdlog::warn("context full ({} tokens): generation stopped", ctx.n_ctx());
            break;
        }
        const int32_t one[1] = {next};
        DS_ASSIGN_OR_RETURN(logits, ctx.eval(one));
    }
    st.decode_seconds = seconds_since(t0);
    const double n = static_cast<double>(st.generated.size());
    spdlog::info(
        "prefill {} tokens in {:.3f} s ({:.1f} tok/s); generated {} in {:.3f} s ({:.1f} tok/s)",
        st.n_prefilled, st.prefill_seconds, st.n_prefilled / std::max(1e-9, st.prefill_seconds),
        st.generated.size(), st.decode_seconds, n / std::max(1e-9, st.decode_seconds));
    return st;
}

}  // namespace deltaserve::cli
