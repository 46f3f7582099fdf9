// The layout of DeltaKV's compressed region, and the plan of what a commit compresses.
#include "deltaserve/kvstore/deltakv_region.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace deltaserve::kvstore {

int32_t DeltaKvRegion::n_refs() const {
    int32_t n = 0;
    for (int32_t p = sinks; p < end; ++p) n += is_ref(p);
    return n;
}

void DeltaKvRegion::choose_refs(int32_t c0, int32_t c1) {
    for (int32_t p = c0; p < c1; ++p) {
        ref_flag[p] = (p - sinks) % stride == 0;
        if (ref_flag[p]) ref_list.push_back(p);
    }
}

void DeltaKvRegion::sync_ref_list() {
    ref_list.clear();
    for (int32_t p = sinks; p < static_cast<int32_t>(ref_flag.size()); ++p) {
        if (ref_flag[p]) ref_list.push_back(p);
    }
}

void DeltaKvRegion::truncate(int32_t n, size_t latent_bytes, int32_t k) {
    int32_t first_latent = -1;
    for (int32_t p = n; p < static_cast<int32_t>(latent_of.size()) && first_latent < 0; ++p)
        first_latent = latent_of[p];
    if (first_latent >= 0) {
        for (size_t sl = 0; sl < latents.size(); ++sl) {
            latents[sl].resize(static_cast<size_t>(first_latent) * latent_bytes);
            refs[sl].resize(static_cast<size_t>(first_latent) * k);
            errors[sl].resize(static_cast<size_t>(first_latent));
        }
    }
    latent_of.resize(static_cast<size_t>(n));
    ref_flag.resize(static_cast<size_t>(n));
    sync_ref_list();
    end = std::max(sinks, std::min(end, n));
}

uint8_t deltakv_error_code(double e) {
    if (!(e > 0.0)) return 1;  // none: the smallest code
    const double c = std::round(8.0 * std::log2(e)) + 185.0;
    return static_cast<uint8_t>(std::clamp(c, 1.0, 255.0));
}

double deltakv_error_of_code(uint8_t code) {
    if (code == 0) return std::numeric_limits<double>::quiet_NaN();
    return std::exp2((static_cast<double>(code) - 185.0) / 8.0);
}

void DeltaKvPlan::start(int32_t n, int32_t region_end) {
    active = true;
    n_total = n;
    carry_before = exact_carry;
    end = region_end;
    blocks.clear();
    tokens.clear();
    std::fill(done.begin(), done.end(), 0);
    for (auto& p : latents) p.clear();
    for (auto& p : refs) p.clear();
    for (auto& p : err) p.clear();
    for (auto& p : errors) p.clear();
}

bool DeltaKvPlan::decided(int32_t judges) const {
    return std::find(done.begin(), done.begin() + judges, uint8_t{0}) == done.begin() + judges;
}

size_t DeltaKvPlan::exact_count(size_t n, float share) const {
    const double want = exact_carry + static_cast<double>(share) * static_cast<double>(n);
    return std::min(n, static_cast<size_t>(want));
}

}  // namespace deltaserve::kvstore
