// Comparing next-token distributions: perplexity and KL divergence from logits, for
// `deltaserve score`, calibration and the benchmarks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deltaserve::model {

// log-softmax of n logits, in double.
void log_softmax(const float* logits, int32_t n, std::vector<double>& out);

// KL(p || q) from the two distributions' log-probabilities (same length); never below 0.
double kl_divergence(std::span<const double> log_p, std::span<const double> log_q);

}  // namespace deltaserve::model
