// DeltaKV's decode-step ops (backend.h, deltakv_ops.h) on every backend here, against
// straightforward float64 references of what they compute: the reference rows turned back
// before RoPE, the latent keys decoded and scored, attention through the latents, and
// attention with its lse split and merged. "cuda" skips without a device. Inputs live in
// the backend's memory (copied in and out), as the cache's would (deltakv_ops_fixture.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "deltakv_ops_fixture.h"
#include "deltaserve/common/fp16.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/deltakv.h"
#include "deltaserve/kernels/deltakv_ops.h"
#include "random_data.h"

namespace deltaserve::kernels {
namespace {

using namespace deltaserve::kernels::testing;  // NOLINT: the fixture, shape and bounds
using deltaserve::testing::random_floats;

// fp16 rows (all KV heads) in a pool with a stride wider than the row.
struct Pool {
    static constexpr size_t kStride = kWidth * 2 + 64;
    std::vector<uint8_t> k, v;
    std::vector<float> k_f, v_f;  // the stored values
    explicit Pool(int slots, uint32_t seed) : k(slots * kStride), v(slots * kStride) {
        const auto kf = random_floats(size_t(slots) * kWidth, seed);
        const auto vf = random_floats(size_t(slots) * kWidth, seed + 1);
        k_f.resize(kf.size());
        v_f.resize(vf.size());
        for (int s = 0; s < slots; ++s) {
            for (int e = 0; e < kWidth; ++e) {
                const size_t i = size_t(s) * kWidth + e;
                const uint16_t hk = fp32_to_fp16(kf[i]), hv = fp32_to_fp16(vf[i]);
                std::memcpy(&k[s * kStride + 2 * e], &hk, 2);
                std::memcpy(&v[s * kStride + 2 * e], &hv, 2);
                k_f[i] = fp16_to_fp32(hk);
                v_f[i] = fp16_to_fp32(hv);
            }
        }
    }
};

// RoPE angles of a few positions, and a reference rotation in float64.
struct Angles {
    std::vector<float> table;
    std::vector<int32_t> at_pos;  // offset of position p's angles
    explicit Angles(int positions) {
        for (int p = 0; p < positions; ++p) {
            at_pos.push_back(static_cast<int32_t>(table.size()));
            table.resize(table.size() + kDim);
            rope_angles(p * 7 + 3, kDim, 10000.0f, table.data() + at_pos.back(),
                        table.data() + at_pos.back() + kDim / 2);
        }
    }
    // Interleaved pairs of every head of x turned by +-the angles at offset `at`.
    void turn(std::vector<double>& x, size_t off, int32_t at, bool inverse) const {
        for (int h = 0; h < kKvHeads; ++h) {
            for (int j = 0; j < kDim / 2; ++j) {
                const double c = table[at + j], s = (inverse ? -1 : 1) * table[at + kDim / 2 + j];
                double& a = x[off + h * kDim + 2 * j];
                double& b = x[off + h * kDim + 2 * j + 1];
                const double a0 = a, b0 = b;
                a = a0 * c - b0 * s;
                b = a0 * s + b0 * c;
            }
        }
    }
};

TEST_P(DeltaKvOps, PoolRowsTurnKeysBackBeforeRope) {
    const Pool pool(50, 1);
    const Angles angles(30);
    std::vector<int32_t> slots, at;
    for (int i = 0; i < 37; ++i) {
        slots.push_back((i * 13) % 50);
        at.push_back(angles.at_pos[(i * 7) % 30]);
    }
    PoolRows rows;
    rows.k = put(pool.k);
    rows.v = put(pool.v);
    rows.row_stride = Pool::kStride;
    rows.slots = slots.data();
    rows.n = static_cast<int64_t>(slots.size());
    rows.width = kWidth;
    rows.angles = RopeAngles{put(angles.table), at.data(), kKvHeads, kDim, RopeStyle::kInterleaved};
    float* out = room<float>(slots.size() * 2 * kWidth);
    ASSERT_TRUE(backend_->deltakv_pool_rows(rows, out, exec_).ok());
    std::vector<double> want(slots.size() * 2 * kWidth);
    for (size_t i = 0; i < slots.size(); ++i) {
        for (int e = 0; e < kWidth; ++e) {
            want[i * 2 * kWidth + e] = pool.k_f[size_t(slots[i]) * kWidth + e];
            want[i * 2 * kWidth + kWidth + e] = pool.v_f[size_t(slots[i]) * kWidth + e];
        }
        angles.turn(want, i * 2 * kWidth, at[i], /*inverse=*/true);
    }
    EXPECT_LT(nmse(get(out, want.size()), want), kBound);

    // K only: rows of kWidth.
    rows.v = nullptr;
    ASSERT_TRUE(backend_->deltakv_pool_rows(rows, out, exec_).ok());
    const std::vector<float> k_only = get(out, slots.size() * kWidth);
    std::vector<double> want_k;
    for (size_t i = 0; i < slots.size(); ++i)
        want_k.insert(want_k.end(), want.begin() + i * 2 * kWidth,
                      want.begin() + i * 2 * kWidth + kWidth);
    EXPECT_LT(nmse(k_only, want_k), kBound);
}

TEST_P(DeltaKvOps, MaxHeadScoresAreTheBestHeadsDot) {
    const Pool pool(50, 3);
    const std::vector<float> q = random_floats(kHeads * kDim, 4);
    std::vector<int32_t> slots;
    for (int i = 0; i < 41; ++i) slots.push_back((i * 29 + 7) % 50);
    PoolKeys keys{put(pool.k), Pool::kStride, slots.data(), static_cast<int64_t>(slots.size())};
    float* scores = room<float>(slots.size());
    ASSERT_TRUE(backend_->max_head_scores(shape_, put(q), keys, scores, exec_).ok());
    std::vector<double> want(slots.size(), -INFINITY);
    for (size_t i = 0; i < slots.size(); ++i) {
        for (int h = 0; h < kHeads; ++h) {
            const int g = h / (kHeads / kKvHeads);
            double dot = 0.0;
            for (int j = 0; j < kDim; ++j)
                dot += double(q[h * kDim + j]) * pool.k_f[size_t(slots[i]) * kWidth + g * kDim + j];
            want[i] = std::max(want[i], dot);
        }
    }
    EXPECT_LT(nmse(get(scores, slots.size()), want), kBound);
    // No rows: nothing to read.
    EXPECT_TRUE(backend_->max_head_scores(shape_, nullptr, PoolKeys{}, nullptr, exec_).ok());
}

// n latent tokens over n_refs references: what the key scores and latent attention read.
struct Latents {
    DeltaKvLayer layer;
    std::vector<float> wd;
    Int4Decoder dec, dec_k;       // all of Dec, its K rows
    std::vector<uint8_t> packed;  // every latent row, int4 or fp16
    std::vector<uint16_t> refs;   // kRefsPer per latent row
    std::vector<int32_t> rows;    // the tokens' latent rows
    size_t stride = 0;
    bool int4 = true;
    Latents(int n_rows, int n_tokens, int n_refs, bool int4_latents, uint32_t seed)
        : wd(random_floats(size_t(2 * kWidth) * kM, seed, 0.2f)), int4(int4_latents) {
        layer.wd = WeightMatrix{DType::kF32, 2 * kWidth, kM, wd.data()};
        layer.w1 = WeightMatrix{DType::kF32, 1, 2 * kWidth, nullptr};  // d() and m() only
        layer.w3 = WeightMatrix{DType::kF32, kM, 1, nullptr};
        dec = make_int4_decoder(layer);
        dec_k = make_int4_decoder(layer, kWidth);
        // int4: an odd stride, so that no alignment is leaned on (fp16 rows stay 2-aligned).
        stride = int4 ? int4_bytes(kM) + 3 : 2 * kM + 2;
        packed.resize(size_t(n_rows) * stride);
        const auto z = random_floats(size_t(n_rows) * kM, seed + 1);
        std::mt19937 rng(seed + 2);
        for (int r = 0; r < n_rows; ++r) {
            uint8_t* p = packed.data() + r * stride;
            if (int4) {
                int4_pack(z.data() + r * kM, kM, p);
            } else {
                for (int j = 0; j < kM; ++j) {
                    const uint16_t h = fp32_to_fp16(z[r * kM + j]);
                    std::memcpy(p + 2 * j, &h, 2);
                }
            }
            for (int q = 0; q < kRefsPer; ++q) {
                // Some latents name fewer references; one names none.
                const bool none = r == 3 || (q > 1 && r % 5 == 0);
                refs.push_back(none ? kNoLatentRef : static_cast<uint16_t>(rng() % n_refs));
            }
        }
        for (int i = 0; i < n_tokens; ++i) rows.push_back((i * 17 + 5) % n_rows);
    }
    // Token i's latent as floats.
    std::vector<double> z(int i) const {
        const uint8_t* p = packed.data() + size_t(rows[i]) * stride;
        std::vector<float> f(kM);
        if (int4) {
            int4_unpack(p, kM, f.data());
        } else {
            for (int j = 0; j < kM; ++j) {
                uint16_t h;
                std::memcpy(&h, p + 2 * j, 2);
                f[j] = fp16_to_fp32(h);
            }
        }
        return {f.begin(), f.end()};
    }
    std::vector<int> refs_of(int i) const {
        std::vector<int> out;
        for (int q = 0; q < kRefsPer; ++q) {
            const uint16_t o = refs[size_t(rows[i]) * kRefsPer + q];
            if (o != kNoLatentRef) out.push_back(o);
        }
        return out;
    }
};

TEST_P(DeltaKvOps, KeyScoresAreTheScaledDotsWithTheDecodedKeys) {
    const int n_refs = 21, n = 300;
    const Latents lat(64, n, n_refs, /*int4=*/true, 7);
    const Angles angles(n);
    const std::vector<float> ref_k = random_floats(size_t(n_refs) * kWidth, 9);
    const std::vector<float> q = random_floats(kHeads * kDim, 10);
    std::vector<int32_t> at(angles.at_pos.begin(), angles.at_pos.end());

    LatentRows rows{n,  lat.rows.data(), put(lat.packed), lat.stride,
                    kM, put(lat.refs),   kRefsPer,        true};
    LatentDecodeInputs in;
    auto dec = backend_->upload_int4_decoder(lat.dec_k);
    ASSERT_TRUE(dec.ok()) << dec.status().to_string();
    in.dec = *dec;
    in.ref_x = put(ref_k);
    in.n_refs = n_refs;
    in.angles = RopeAngles{put(angles.table), at.data(), kKvHeads, kDim, RopeStyle::kInterleaved};
    const int64_t lds = n + 5;
    float* scores = room<float>(kHeads * lds);
    const int m16 = int4_code_stride(kM);
    uint8_t* codes = room<uint8_t>(size_t(n) * m16);
    ASSERT_TRUE(
        backend_->deltakv_key_scores(shape_, rows, in, put(q), scores, lds, codes, exec_).ok());

    // The key as the int4 decoder defines it: Dec_k's int8 rows times the codes, exactly.
    std::vector<double> want(size_t(kHeads) * n);
    std::vector<uint8_t> want_codes(size_t(n) * m16);
    for (int i = 0; i < n; ++i) {
        const uint8_t* p = lat.packed.data() + size_t(lat.rows[i]) * lat.stride;
        int4_latent_codes(&p, 1, kM, want_codes.data() + size_t(i) * m16);
        const float s = fp16_to_fp32(uint16_t(p[0] | p[1] << 8)),
                    lo = fp16_to_fp32(uint16_t(p[2] | p[3] << 8));
        std::vector<double> key(kWidth);
        const std::vector<int> refs = lat.refs_of(i);
        for (int r = 0; r < kWidth; ++r) {
            long dot = 0;
            for (int j = 0; j < m16; ++j) {
                dot += lat.dec_k.w[(size_t(j / 4) * kWidth + r) * 4 + j % 4] *
                       want_codes[size_t(i) * m16 + j];
            }
            key[r] = double(lo) * lat.dec_k.row_sum[r] + double(s) * lat.dec_k.scale[r] * dot;
            double mean = 0.0;
            for (int o : refs) mean += ref_k[size_t(o) * kWidth + r];
            if (!refs.empty()) key[r] += mean / refs.size();
        }
        angles.turn(key, 0, at[i], /*inverse=*/false);
        for (int h = 0; h < kHeads; ++h) {
            double acc = 0.0;
            for (int d = 0; d < kDim; ++d) acc += q[h * kDim + d] * key[(h / 3) * kDim + d];
            want[size_t(h) * n + i] = acc * shape_.scale;
        }
    }
    const std::vector<float> all = get(scores, size_t(kHeads) * lds);
    std::vector<float> got;
    for (int h = 0; h < kHeads; ++h)
        got.insert(got.end(), all.begin() + h * lds, all.begin() + h * lds + n);
    EXPECT_LT(nmse(got, want), kBound);
    EXPECT_EQ(get(codes, want_codes.size()), want_codes);
}

TEST_P(DeltaKvOps, ReconstructionIsTheWholeRowInFp16) {
    const int n_refs = 17, n = 90;
    const Latents lat(50, n, n_refs, /*int4=*/true, 11);
    const Angles angles(n);
    const std::vector<float> ref_x = random_floats(size_t(n_refs) * 2 * kWidth, 12);
    std::vector<int32_t> at(angles.at_pos.begin(), angles.at_pos.end());
    LatentRows rows{n,  lat.rows.data(), put(lat.packed), lat.stride,
                    kM, put(lat.refs),   kRefsPer,        true};
    LatentDecodeInputs in;
    auto dec = backend_->upload_int4_decoder(lat.dec);
    ASSERT_TRUE(dec.ok()) << dec.status().to_string();
    in.dec = *dec;
    in.ref_x = put(ref_x);
    in.n_refs = n_refs;
    in.angles = RopeAngles{put(angles.table), at.data(), kKvHeads, kDim, RopeStyle::kInterleaved};
    const size_t stride = kWidth * 2 + 6;
    uint8_t* k_out = room<uint8_t>(n * stride);
    uint8_t* v_out = room<uint8_t>(n * stride);
    const AttentionShape kv{kKvHeads, kKvHeads, kDim, 0.0f};
    ASSERT_TRUE(backend_->deltakv_reconstruct(kv, rows, in, k_out, v_out, stride, exec_).ok());

    const int m16 = int4_code_stride(kM);
    std::vector<double> want;
    std::vector<float> got;
    const std::vector<uint8_t> k_bytes = get(k_out, n * stride), v_bytes = get(v_out, n * stride);
    for (int i = 0; i < n; ++i) {
        const uint8_t* p = lat.packed.data() + size_t(lat.rows[i]) * lat.stride;
        std::vector<uint8_t> codes(m16);
        int4_latent_codes(&p, 1, kM, codes.data());
        const float s = fp16_to_fp32(uint16_t(p[0] | p[1] << 8)),
                    lo = fp16_to_fp32(uint16_t(p[2] | p[3] << 8));
        std::vector<double> x(2 * kWidth);
        const std::vector<int> refs = lat.refs_of(i);
        for (int r = 0; r < 2 * kWidth; ++r) {
            long dot = 0;
            for (int j = 0; j < m16; ++j)
                dot += lat.dec.w[(size_t(j / 4) * 2 * kWidth + r) * 4 + j % 4] * codes[j];
            x[r] = double(lo) * lat.dec.row_sum[r] + double(s) * lat.dec.scale[r] * dot;
            double mean = 0.0;
            for (int o : refs) mean += ref_x[size_t(o) * 2 * kWidth + r];
            if (!refs.empty()) x[r] += mean / refs.size();
        }
        angles.turn(x, 0, at[i], /*inverse=*/false);
        want.insert(want.end(), x.begin(), x.end());
        for (int half = 0; half < 2; ++half) {
            const uint8_t* row = (half == 0 ? k_bytes : v_bytes).data() + size_t(i) * stride;
            for (int e = 0; e < kWidth; ++e) {
                uint16_t h;
                std::memcpy(&h, row + 2 * e, 2);
                got.push_back(fp16_to_fp32(h));
            }
        }
    }
    // fp16's rounding: a relative 2^-11 at most, NMSE ~1e-7.
    EXPECT_LT(nmse(got, want), 1e-6);
}

class LatentAttentionOps : public DeltaKvOps {
  protected:
    // Latent attention against attention over the values made whole: V_i = Dec_v(z_i) +
    // the mean of its references' V rows, softmax of the given scores.
    void check(bool int4, int n) {
        const int n_refs = 33;
        const Latents lat(80, n, n_refs, int4, 20 + n);
        const Pool refs_pool(n_refs + 10, 30);
        std::vector<int32_t> ref_slots(n_refs);
        for (int r = 0; r < n_refs; ++r) ref_slots[r] = (r * 7 + 2) % (n_refs + 10);
        const std::vector<float> scores = random_floats(size_t(kHeads) * std::max(n, 1), 40, 2.0f);

        LatentRows rows{n,  lat.rows.data(), put(lat.packed), lat.stride,
                        kM, put(lat.refs),   kRefsPer,        int4};
        LatentValueInputs in;
        std::vector<uint8_t> codes(size_t(std::max(n, 1)) * int4_code_stride(kM));
        for (int i = 0; i < n && int4; ++i) {
            const uint8_t* p = lat.packed.data() + size_t(lat.rows[i]) * lat.stride;
            int4_latent_codes(&p, 1, kM, codes.data() + size_t(i) * int4_code_stride(kM));
        }
        in.codes = put(codes);
        in.wd_v = put(std::vector<float>(lat.wd.begin() + size_t(kWidth) * kM, lat.wd.end()));
        in.ref_v = put(refs_pool.v);
        in.ref_stride = Pool::kStride;
        in.ref_slots = ref_slots.data();
        in.n_refs = n_refs;
        float* out = room<float>(kHeads * kDim);
        float* lse = room<float>(kHeads);
        ASSERT_TRUE(
            backend_->latent_attention(shape_, rows, put(scores), in, out, lse, exec_).ok());

        std::vector<double> want(kHeads * kDim, 0.0), want_lse(kHeads);
        for (int h = 0; h < kHeads; ++h) {
            const int g = h / 3;
            double mx = -INFINITY, l = 0.0;
            for (int i = 0; i < n; ++i) mx = std::max(mx, double(scores[size_t(h) * n + i]));
            for (int i = 0; i < n; ++i) {
                const double p = std::exp(scores[size_t(h) * n + i] - mx);
                l += p;
                const std::vector<double> z = lat.z(i);
                const std::vector<int> refs = lat.refs_of(i);
                for (int d = 0; d < kDim; ++d) {
                    double v = 0.0;
                    for (int j = 0; j < kM; ++j)
                        v += lat.wd[size_t(kWidth + g * kDim + d) * kM + j] * z[j];
                    double mean = 0.0;
                    for (int o : refs)
                        mean += refs_pool.v_f[size_t(ref_slots[o]) * kWidth + g * kDim + d];
                    if (!refs.empty()) v += mean / refs.size();
                    want[h * kDim + d] += p * v;
                }
            }
            for (int d = 0; d < kDim; ++d)
                want[h * kDim + d] = l > 0 ? want[h * kDim + d] / l : 0.0;
            want_lse[h] = l > 0 ? mx + std::log(l) : -INFINITY;
        }
        EXPECT_LT(nmse(get(out, want.size()), want), kBound)
            << (int4 ? "int4" : "fp16") << ", n " << n;
        const std::vector<float> got_lse = get(lse, kHeads);
        for (int h = 0; h < kHeads; ++h) {
            if (n == 0) {
                EXPECT_EQ(got_lse[h], -INFINITY);
            } else {
                EXPECT_NEAR(got_lse[h], want_lse[h], 1e-5 * (1 + std::fabs(want_lse[h]))) << h;
            }
        }
    }
};

TEST_P(LatentAttentionOps, IsAttentionOverTheDecodedValues) {
    for (int n : {1, 70, 600}) {  // one piece of tokens, and several (kernels split at 64, 256)
        check(/*int4=*/true, n);
        check(/*int4=*/false, n);
    }
}

TEST_P(LatentAttentionOps, NoTokensGiveNothingAndAnEmptyLse) { check(/*int4=*/true, 0); }

TEST_P(DeltaKvOps, AttentionSplitInTwoAndMergedIsAttentionOverBoth) {
    const Pool pool(120, 50);
    const int n = 100, n_q = 3;
    std::vector<int32_t> slots(n);
    for (int i = 0; i < n; ++i) slots[i] = (i * 11 + 1) % 120;
    const std::vector<float> q = random_floats(size_t(n_q) * kHeads * kDim, 51);
    KvView whole{DType::kF16, put(pool.k), put(pool.v), Pool::kStride, slots.data(), n};
    whole.head_stride = kDim * 2;
    KvView a = whole, b = whole;
    a.n = 40;
    b.slots = slots.data() + 40;
    b.n = n - 40;
    const size_t rows = size_t(n_q) * kHeads;
    float* qd = put(q);
    float* out = room<float>(rows * kDim);
    float* out_b = room<float>(rows * kDim);
    float* lse = room<float>(rows);
    float* lse_b = room<float>(rows);
    // Not causal: every query sees every entry of each part.
    ASSERT_TRUE(backend_
                    ->attention_lse(shape_, a, qd, kHeads * kDim, n_q, out, kHeads * kDim, lse,
                                    false, exec_)
                    .ok());
    ASSERT_TRUE(backend_
                    ->attention_lse(shape_, b, qd, kHeads * kDim, n_q, out_b, kHeads * kDim, lse_b,
                                    false, exec_)
                    .ok());
    ASSERT_TRUE(backend_->merge_attention(out, lse, out_b, lse_b, int(rows), kDim, exec_).ok());

    std::vector<double> want(rows * kDim, 0.0), want_lse(rows);
    for (int i = 0; i < n_q; ++i) {
        for (int h = 0; h < kHeads; ++h) {
            const int g = h / 3;
            std::vector<double> s(n);
            double mx = -INFINITY;
            for (int t = 0; t < n; ++t) {
                double acc = 0.0;
                for (int d = 0; d < kDim; ++d)
                    acc += q[(i * kHeads + h) * kDim + d] *
                           pool.k_f[size_t(slots[t]) * kWidth + g * kDim + d];
                s[t] = acc * shape_.scale;
                mx = std::max(mx, s[t]);
            }
            double l = 0.0;
            const size_t r = size_t(i) * kHeads + h;
            for (int t = 0; t < n; ++t) {
                const double p = std::exp(s[t] - mx);
                l += p;
                for (int d = 0; d < kDim; ++d)
                    want[r * kDim + d] += p * pool.v_f[size_t(slots[t]) * kWidth + g * kDim + d];
            }
            for (int d = 0; d < kDim; ++d) want[r * kDim + d] /= l;
            want_lse[r] = mx + std::log(l);
        }
    }
    EXPECT_LT(nmse(get(out, want.size()), want), kBound);
    EXPECT_LT(nmse(get(lse, rows), want_lse), kBound);
}

TEST_P(DeltaKvOps, ArgumentsOutsideTheLimitsAreRefused) {
    const Latents lat(8, 4, 3, true, 60);
    const Angles angles(4);
    std::vector<int32_t> at(angles.at_pos.begin(), angles.at_pos.end());
    LatentRows rows{4,  lat.rows.data(), put(lat.packed), lat.stride,
                    kM, put(lat.refs),   kRefsPer,        true};
    LatentDecodeInputs in;
    auto dec = backend_->upload_int4_decoder(lat.dec_k);
    ASSERT_TRUE(dec.ok());
    in.dec = *dec;
    in.ref_x = room<float>(3 * kWidth);
    in.n_refs = 3;
    in.angles = RopeAngles{put(angles.table), at.data(), kKvHeads, kDim, RopeStyle::kInterleaved};
    float* scores = room<float>(kHeads * 4);
    uint8_t* codes = room<uint8_t>(4 * int4_code_stride(kM));
    const float* q = room<float>(kHeads * kDim);
    ASSERT_TRUE(backend_->deltakv_key_scores(shape_, rows, in, q, scores, 4, codes, exec_).ok());
    const auto refused = [&](LatentRows r, LatentDecodeInputs i, const char* what) {
        const Status st = backend_->deltakv_key_scores(shape_, r, i, q, scores, 4, codes, exec_);
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.to_string();
    };
    LatentRows bad = rows;
    bad.k = 17;
    refused(bad, in, "17 references");
    bad = rows;
    bad.m = 0;
    refused(bad, in, "m = 0");
    bad = rows;
    bad.stride = 3;
    refused(bad, in, "latents closer than their size");
    bad = rows;
    bad.int4 = false;
    refused(bad, in, "fp16 latents");
    EXPECT_EQ(backend_->deltakv_key_scores(shape_, rows, in, q, scores, 4, nullptr, exec_).code(),
              StatusCode::kInvalidArgument)
        << "no room for the codes";
    EXPECT_EQ(backend_->deltakv_key_scores(shape_, rows, in, q, scores, 3, codes, exec_).code(),
              StatusCode::kInvalidArgument)
        << "scores' rows closer than n";
    LatentDecodeInputs bad_in = in;
    bad_in.dec.d = kWidth - 1;
    refused(rows, bad_in, "a decoder of another width");
    bad_in = in;
    bad_in.angles.head_dim = 3;
    refused(rows, bad_in, "odd head_dim");

    uint8_t* rows_out = room<uint8_t>(4 * 4 * kWidth);
    const Status whole =
        backend_->deltakv_reconstruct(shape_, rows, in, rows_out, rows_out, 2 * kWidth, exec_);
    EXPECT_EQ(whole.code(), StatusCode::kInvalidArgument) << "reconstruction with the K rows only";

    PoolRows pr;
    pr.k = lat.packed.data();
    pr.row_stride = 10;
    pr.slots = at.data();
    pr.n = 1;
    pr.width = kWidth;
    pr.angles = in.angles;
    EXPECT_EQ(backend_->deltakv_pool_rows(pr, scores, exec_).code(), StatusCode::kInvalidArgument);

    LatentValueInputs vin;  // no decoder
    EXPECT_EQ(backend_->latent_attention(shape_, rows, scores, vin, scores, scores, exec_).code(),
              StatusCode::kInvalidArgument);

    PoolKeys keys{put(lat.packed), 2 * kWidth - 2, at.data(), 1};  // rows closer than K's
    EXPECT_EQ(backend_->max_head_scores(shape_, q, keys, scores, exec_).code(),
              StatusCode::kInvalidArgument);
    keys.row_stride = 2 * kWidth;
    keys.slots = nullptr;
    EXPECT_EQ(backend_->max_head_scores(shape_, q, keys, scores, exec_).code(),
              StatusCode::kInvalidArgument)
        << "rows without their slots";
}

INSTANTIATE_TEST_SUITE_P(Backends, DeltaKvOps, ::testing::Values("cpu", "cuda"));
INSTANTIATE_TEST_SUITE_P(Backends, LatentAttentionOps, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace deltaserve::kernels
