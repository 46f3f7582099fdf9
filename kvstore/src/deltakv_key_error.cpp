// How far a profile's reconstructed keys are from the real ones: the variance that
// DeltaKvSequenceCache corrects attention logits for (deltakv_cache.h, logit_correction).
#include <algorithm>

#include "deltaserve/kernels/deltakv.h"
#include "deltaserve/kvstore/deltakv_cache.h"

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

std::vector<float> deltakv_key_error_variance(const DeltaKvProfile& profile, int32_t layer,
                                              const float* x, int32_t n, const DeltaKvOptions& o,
                                              ThreadPool& threads) {
    const int32_t d = profile.d, kv_dim = d / 2, hd = o.head_dim, half = hd / 2, kk = o.k;
    std::vector<float> var(static_cast<size_t>(o.n_kv_heads) * half, 0.0f);
    std::vector<int32_t> refs, latent;
    for (int32_t p = 0; p < n; ++p) {
        const bool ref = p < o.sinks || (p - o.sinks) % o.stride == 0;
        (ref ? refs : latent).push_back(p);
    }
    const int64_t nl = static_cast<int64_t>(latent.size());
    if (nl == 0 || !profile.has_compressor(layer)) return var;
    std::vector<float> ref_x(refs.size() * d), lx(static_cast<size_t>(nl) * d), rm(lx.size());
    for (size_t i = 0; i < refs.size(); ++i)
        std::copy_n(x + static_cast<size_t>(refs[i]) * d, d, ref_x.data() + i * d);
    threads.parallel_for(nl, 8, [&](int64_t b, int64_t e) {
        std::vector<int32_t> near(static_cast<size_t>(kk));
        for (int64_t i = b; i < e; ++i) {
            const int32_t p = latent[i];
            float* xi = lx.data() + i * d;
            std::copy_n(x + static_cast<size_t>(p) * d, d, xi);
            // References before the token, as the cache picks them.
            const int n_cand =
                static_cast<int>(std::upper_bound(refs.begin(), refs.end(), p) - refs.begin());
            const int got = k::l2_nearest(xi, ref_x.data(), n_cand, d, kk, near.data());
            float* ri = rm.data() + i * d;
            std::fill(ri, ri + d, 0.0f);
            for (int j = 0; j < got; ++j) {
                const float* rx = ref_x.data() + static_cast<size_t>(near[j]) * d;
                for (int32_t t = 0; t < d; ++t) ri[t] += rx[t] / static_cast<float>(got);
            }
        }
    });
    const k::DeltaKvLayer& w = profile.layers[layer];
    std::vector<float> z(static_cast<size_t>(nl) * profile.m),
        scratch(static_cast<size_t>(2 * nl * w.w1.rows));
    k::deltakv_encode_residual(w, lx.data(), rm.data(), nl, z.data(), scratch.data(), threads);
    // Decode as the cache does: int4 latents through the int8 decoder, or fp32.
    std::vector<float> kr(static_cast<size_t>(nl) * kv_dim), full(d);
    if (o.latent_bits == 4 && static_cast<size_t>(layer) < profile.int4_k.size()) {
        const size_t lb = k::int4_bytes(profile.m);
        std::vector<uint8_t> packed(static_cast<size_t>(nl) * lb);
        std::vector<const uint8_t*> ptrs(static_cast<size_t>(nl));
        for (int64_t i = 0; i < nl; ++i) {
            k::int4_pack(z.data() + i * profile.m, profile.m, packed.data() + i * lb);
            ptrs[i] = packed.data() + i * lb;
        }
        k::deltakv_decode_int4(profile.int4_k[layer], ptrs.data(), nl, kr.data(), kv_dim);
        for (int64_t i = 0; i < nl; ++i) {
            for (int32_t t = 0; t < kv_dim; ++t) kr[i * kv_dim + t] += rm[i * d + t];
        }
    } else {
        for (int64_t i = 0; i < nl; ++i) {
            k::deltakv_decode(w, z.data() + i * profile.m, rm.data() + i * d, full.data());
            std::copy_n(full.data(), kv_dim, kr.data() + i * kv_dim);
        }
    }
    std::vector<double> sum(var.size(), 0.0);
    for (int64_t i = 0; i < nl; ++i) {
        for (int32_t j = 0; j < kv_dim; ++j) {
            const double e = static_cast<double>(kr[i * kv_dim + j]) - lx[i * d + j];
            const int32_t t = j % hd;
            const int32_t pair = o.rope_style == k::RopeStyle::kInterleaved ? t / 2 : t % half;
            sum[static_cast<size_t>(j / hd) * half + pair] += e * e;
        }
    }
    for (size_t i = 0; i < var.size(); ++i)
        var[i] = static_cast<float>(sum[i] / (2.0 * static_cast<double>(nl)));
    return var;
}

}  // namespace deltaserve::kvstore
