#include "deltaserve/model/scoring.h"

#include <algorithm>
#include <cmath>

namespace deltaserve::model {

void log_softmax(const float* logits, int32_t n, std::vector<double>& out) {
    out.resize(static_cast<size_t>(n));
    double mx = logits[0], sum = 0;
    for (int32_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
    for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    for (int32_t i = 0; i < n; ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

double kl_divergence(std::span<const double> log_p, std::span<const double> log_q) {
    double kl = 0;
    for (size_t v = 0; v < log_p.size(); ++v) kl += std::exp(log_p[v]) * (log_p[v] - log_q[v]);
    return std::max(0.0, kl);  // rounding can dip below
}

}  // namespace deltaserve::model
