// Random test inputs from fixed seeds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace deltaserve::testing {

// n values from N(0, scale^2).
inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

}  // namespace deltaserve::testing
