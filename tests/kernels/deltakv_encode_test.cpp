// DeltaKV's compression op (Backend::deltakv_encode) on every backend here, against a float64
// reference of what it computes: each token's nearest candidate references, their mean, the
// latent z = E(x) - E(mean), and z as stored (int4_pack's bytes, or fp16). "cuda" skips
// without a device. Inputs live in the backend's memory (deltakv_ops_fixture.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
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

constexpr int kD = 2 * kWidth, kHidden = 64;

// A random compressor (fp32, as profiles hold it), and E in float64.
struct Compressor {
    std::vector<float> w1 = random_floats(size_t(kHidden) * kD, 31, 0.05f);
    std::vector<float> w2 = random_floats(size_t(kHidden) * kD, 32, 0.05f);
    std::vector<float> w3 = random_floats(size_t(kM) * kHidden, 33, 0.2f);
    DeltaKvLayer host() const {
        DeltaKvLayer l;
        l.w1 = WeightMatrix{DType::kF32, kHidden, kD, w1.data()};
        l.w2 = WeightMatrix{DType::kF32, kHidden, kD, w2.data()};
        l.w3 = WeightMatrix{DType::kF32, kM, kHidden, w3.data()};
        return l;
    }
    std::vector<double> encode(const std::vector<double>& x) const {
        std::vector<double> h(kHidden), e(kM, 0.0);
        for (int r = 0; r < kHidden; ++r) {
            double a = 0.0, b = 0.0;
            for (int c = 0; c < kD; ++c) {
                a += double(w1[size_t(r) * kD + c]) * x[c];
                b += double(w2[size_t(r) * kD + c]) * x[c];
            }
            h[r] = a / (1.0 + std::exp(-a)) * b;
        }
        for (int r = 0; r < kM; ++r) {
            for (int c = 0; c < kHidden; ++c) e[r] += double(w3[size_t(r) * kHidden + c]) * h[c];
        }
        return e;
    }
};

class DeltaKvEncode : public DeltaKvOps {
  protected:
    // The op's outputs for n tokens, copied out.
    struct Encoded {
        std::vector<uint16_t> refs;
        std::vector<float> rm, z;
        std::vector<uint8_t> latents;
    };
    Status encode(const LatentEncodeInputs& in, const std::vector<float>& x, int64_t n, bool int4,
                  size_t stride, Encoded* got) {
        LatentEncodeOutputs out;
        out.refs = room<uint16_t>(size_t(n) * in.k);
        out.rm = room<float>(size_t(n) * kD);
        out.z = room<float>(size_t(n) * kM);
        out.latents = room<uint8_t>(size_t(n) * stride);
        out.stride = stride;
        out.int4 = int4;
        Status st = backend_->deltakv_encode(in, put(x), n, out, exec_);
        if (st.ok() && got != nullptr) {
            got->refs = get(out.refs, size_t(n) * in.k);
            got->rm = get(out.rm, size_t(n) * kD);
            got->z = get(out.z, size_t(n) * kM);
            got->latents = get(out.latents, size_t(n) * stride);
        }
        return st;
    }
    void check(bool int4) {
        const Compressor comp;
        auto w = comp.host();
        DeltaKvLayer on = w;
        for (WeightMatrix* m : {&on.w1, &on.w2, &on.w3}) {
            auto up = backend_->upload_weight(*m);
            ASSERT_TRUE(up.ok()) << up.status().to_string();
            *m = *up;
        }
        const int n_refs = 150, n = 70, kk = kRefsPer;
        const std::vector<float> ref_x = random_floats(size_t(n_refs) * kD, 41);
        const std::vector<float> x = random_floats(size_t(n) * kD, 42);
        // Candidates as the cache gives them (the references at or before a token), some
        // tokens with fewer than k and one with none.
        std::vector<int32_t> n_cand(n);
        for (int i = 0; i < n; ++i)
            n_cand[i] = i == 5 ? 0 : i == 6 ? 2 : std::min(n_refs, 3 + 2 * i);
        LatentEncodeInputs in;
        in.w = &on;
        in.ref_x = put(ref_x);
        in.n_refs = n_refs;
        in.n_cand = n_cand.data();
        in.k = kk;
        // An odd stride, so that no alignment is leaned on.
        const size_t stride = (int4 ? int4_bytes(kM) : 2 * size_t(kM)) + 3;
        Encoded got;
        ASSERT_TRUE(encode(in, x, n, int4, stride, &got).ok());

        std::vector<double> want_rm(size_t(n) * kD), want_z(size_t(n) * kM);
        for (int i = 0; i < n; ++i) {
            std::vector<std::pair<double, int>> dist;
            for (int c = 0; c < n_cand[i]; ++c) {
                double s = 0.0;
                for (int t = 0; t < kD; ++t) {
                    const double diff = double(x[size_t(i) * kD + t]) - ref_x[size_t(c) * kD + t];
                    s += diff * diff;
                }
                dist.push_back({s, c});
            }
            std::sort(dist.begin(), dist.end());
            const int have = std::min<int>(kk, n_cand[i]);
            std::vector<double> rm(kD, 0.0), xi(kD);
            for (int j = 0; j < kk; ++j) {
                const uint16_t want = j < have ? uint16_t(dist[j].second) : kNoLatentRef;
                EXPECT_EQ(got.refs[size_t(i) * kk + j], want) << "token " << i << ", ref " << j;
                if (j >= have) continue;
                for (int t = 0; t < kD; ++t) rm[t] += ref_x[size_t(dist[j].second) * kD + t];
            }
            for (int t = 0; t < kD; ++t) {
                rm[t] /= std::max(have, 1);
                want_rm[size_t(i) * kD + t] = rm[t];
                xi[t] = x[size_t(i) * kD + t];
            }
            const std::vector<double> ex = comp.encode(xi), er = comp.encode(rm);
            for (int j = 0; j < kM; ++j) want_z[size_t(i) * kM + j] = ex[j] - er[j];
        }
        EXPECT_LT(nmse(got.rm, want_rm), kBound);
        EXPECT_LT(nmse(got.z, want_z), kBound);
        // The token without candidates is encoded against zeros.
        for (int t = 0; t < kD; ++t) ASSERT_EQ(got.rm[size_t(5) * kD + t], 0.0f);

        // The latents are the op's own z as stored, to the bit: int4_pack's rounding of the
        // scale, minimum and codes, or fp16 rounded to nearest even.
        for (int i = 0; i < n; ++i) {
            std::vector<uint8_t> want(stride, 0);
            const float* zi = got.z.data() + size_t(i) * kM;
            if (int4) {
                int4_pack(zi, kM, want.data());
            } else {
                for (int j = 0; j < kM; ++j) {
                    const uint16_t h = fp32_to_fp16(zi[j]);
                    std::memcpy(want.data() + 2 * j, &h, 2);
                }
            }
            const size_t bytes = int4 ? int4_bytes(kM) : 2 * size_t(kM);
            EXPECT_EQ(std::memcmp(got.latents.data() + size_t(i) * stride, want.data(), bytes), 0)
                << "token " << i;
        }
    }
};

TEST_P(DeltaKvEncode, Int4LatentsOfTheNearestReferencesResidual) { check(/*int4=*/true); }
TEST_P(DeltaKvEncode, Fp16LatentsOfTheNearestReferencesResidual) { check(/*int4=*/false); }

TEST_P(DeltaKvEncode, NoTokensWriteNothing) {
    const Compressor comp;
    DeltaKvLayer w = comp.host();
    LatentEncodeInputs in;
    in.w = &w;
    in.k = kRefsPer;
    LatentEncodeOutputs out;
    out.stride = int4_bytes(kM);
    EXPECT_TRUE(backend_->deltakv_encode(in, nullptr, 0, out, exec_).ok());
}

TEST_P(DeltaKvEncode, ArgumentsOutsideTheLimitsAreRefused) {
    const Compressor comp;
    DeltaKvLayer w = comp.host();
    for (WeightMatrix* m : {&w.w1, &w.w2, &w.w3}) {
        auto up = backend_->upload_weight(*m);
        ASSERT_TRUE(up.ok());
        *m = *up;
    }
    const std::vector<float> ref_x = random_floats(size_t(8) * kD, 51);
    const std::vector<float> x = random_floats(size_t(4) * kD, 52);
    std::vector<int32_t> n_cand = {1, 2, 8, 8};
    const auto good = [&] {
        LatentEncodeInputs in;
        in.w = &w;
        in.ref_x = put(ref_x);
        in.n_refs = 8;
        in.n_cand = n_cand.data();
        in.k = kRefsPer;
        return in;
    };
    ASSERT_TRUE(encode(good(), x, 4, true, int4_bytes(kM), nullptr).ok());
    const auto refused = [&](LatentEncodeInputs in, size_t stride, const char* what) {
        const Status st = encode(in, x, 4, true, stride, nullptr);
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.to_string();
    };
    LatentEncodeInputs in = good();
    in.k = 0;
    refused(in, int4_bytes(kM), "no references per token");
    in.k = 17;
    refused(in, int4_bytes(kM), "17 references per token");
    in = good();
    in.w = nullptr;
    refused(in, int4_bytes(kM), "no compressor");
    refused(good(), int4_bytes(kM) - 1, "latents closer than their size");
    n_cand[2] = 9;
    refused(good(), int4_bytes(kM), "candidates past the references");
    n_cand[2] = -1;
    refused(good(), int4_bytes(kM), "negative candidates");
    n_cand[2] = 8;
    DeltaKvLayer bad = w;
    bad.w3.cols = kHidden + 1;
    in = good();
    in.w = &bad;
    refused(in, int4_bytes(kM), "matrices that do not chain");
}

INSTANTIATE_TEST_SUITE_P(Backends, DeltaKvEncode, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace deltaserve::kernels
