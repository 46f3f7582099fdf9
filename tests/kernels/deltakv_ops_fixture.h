// What the DeltaKV ops' tests share (deltakv_ops_test.cpp, deltakv_encode_test.cpp): the
// attention shape, a fixture per backend ("cuda" skips without a device) whose inputs live in
// the backend's memory, and the NMSE they are bounded by.
//
// Bounds (NMSE against float64 references): the CPU backend and a GPU compute in fp32 with
// other orders, exps and fused multiply-adds; over these sizes that is ~1e-12, far below the
// errors an indexing or formula mistake makes (~1e-1).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "deltaserve/kernels/backend.h"
#include "random_data.h"

namespace deltaserve::kernels::testing {

inline constexpr double kBound = 1e-9;

inline double nmse(const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < want.size(); ++i) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return num / den;
}

// The model of the tests: SmolLM2's attention (9 query heads over 3 KV heads of 64).
inline constexpr int kHeads = 9, kKvHeads = 3, kDim = 64, kWidth = kKvHeads * kDim, kM = 40,
                     kRefsPer = 4;

class DeltaKvOps : public ::testing::TestWithParam<const char*> {
  protected:
    void SetUp() override {
        backend_ = find_backend(GetParam());
        if (backend_ == nullptr || !backend_->available())
            GTEST_SKIP() << "no " << GetParam() << " backend with a device here";
        exec_.pool = &pool_;
        shape_ = AttentionShape{kHeads, kKvHeads, kDim, 1.0f / std::sqrt(float(kDim))};
    }

    // A copy of v in the backend's memory, kept for the test.
    template <class T>
    T* put(const std::vector<T>& v) {
        auto buf = backend_->alloc(std::max<size_t>(v.size() * sizeof(T), 1));
        EXPECT_TRUE(buf.ok());
        EXPECT_TRUE(backend_->copy_in(buf->data(), v.data(), v.size() * sizeof(T), exec_).ok());
        buffers_.push_back(std::move(*buf));
        return static_cast<T*>(buffers_.back().data());
    }
    template <class T>
    T* room(size_t n) {
        return put(std::vector<T>(n));
    }
    template <class T>
    std::vector<T> get(const T* dev, size_t n) {
        std::vector<T> v(n);
        EXPECT_TRUE(backend_->copy_out(v.data(), dev, n * sizeof(T), exec_).ok());
        return v;
    }

    Backend* backend_ = nullptr;
    ThreadPool pool_{2};
    Exec exec_;
    AttentionShape shape_;
    std::vector<Buffer> buffers_;
};

}  // namespace deltaserve::kernels::testing
