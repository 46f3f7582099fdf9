// NFC (UAX #15) over the generated tables of unicode_nfc_data.cpp; Hangul syllables are
// decomposed and composed arithmetically.
#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "unicode.h"

namespace deltaserve::model::unicode {
namespace {

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr uint32_t kSCount = kLCount * kNCount;

uint8_t combining_class(uint32_t cp) {
    if (cp < 0x300) return 0;
    const auto* begin = detail::kCombiningClasses;
    const auto* end = begin + detail::kCombiningClassesCount;
    const auto* it = std::lower_bound(
        begin, end, cp,
        [](const detail::CombiningClassRange& r, uint32_t v) { return r.last < v; });
    return it != end && it->first <= cp ? it->ccc : 0;
}

const detail::Decomposition* find_decomposition(uint32_t cp) {
    const auto* begin = detail::kDecompositions;
    const auto* end = begin + detail::kDecompositionsCount;
    const auto* it = std::lower_bound(
        begin, end, cp, [](const detail::Decomposition& d, uint32_t v) { return d.cp < v; });
    return it != end && it->cp == cp ? it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>* out) {
    if (cp >= kSBase && cp < kSBase + kSCount) {
        const uint32_t s = cp - kSBase;
        out->push_back(kLBase + s / kNCount);
        out->push_back(kVBase + (s % kNCount) / kTCount);
        if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
        return;
    }
    const detail::Decomposition* d = cp < 0xC0 ? nullptr : find_decomposition(cp);
    if (d == nullptr) {
        out->push_back(cp);
        return;
    }
    decompose(d->first, out);
    if (d->second != 0) decompose(d->second, out);
}

// The primary composite of (first, second), or 0.
uint32_t compose(uint32_t first, uint32_t second) {
    if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
        second < kVBase + kVCount) {
        return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
    }
    if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
        second > kTBase && second < kTBase + kTCount) {
        return first + (second - kTBase);
    }
    static const auto* pairs = [] {
        auto* map = new std::unordered_map<uint64_t, uint32_t>();
        for (size_t i = 0; i < detail::kDecompositionsCount; ++i) {
            const detail::Decomposition& d = detail::kDecompositions[i];
            if (d.composes) map->emplace((uint64_t{d.first} << 32) | d.second, d.cp);
        }
        return map;
    }();
    auto it = pairs->find((uint64_t{first} << 32) | second);
    return it == pairs->end() ? 0 : it->second;
}

}  // namespace

std::vector<uint32_t> nfc(std::span<const uint32_t> cps) {
    // Nothing below U+0300 decomposes or composes with what precedes it.
    if (std::all_of(cps.begin(), cps.end(), [](uint32_t cp) { return cp < 0x300; })) {
        return {cps.begin(), cps.end()};
    }
    std::vector<uint32_t> d;
    d.reserve(cps.size() + 8);
    for (uint32_t cp : cps) decompose(cp, &d);
    // Canonical order: each run of non-starters sorted by class, stably.
    for (size_t i = 0; i < d.size();) {
        size_t j = i;
        while (j < d.size() && combining_class(d[j]) != 0) ++j;
        if (j - i > 1) {
            std::stable_sort(d.begin() + i, d.begin() + j, [](uint32_t a, uint32_t b) {
                return combining_class(a) < combining_class(b);
            });
        }
        i = j == i ? i + 1 : j;
    }
    // Canonical composition: a character joins the last starter unless something between
    // them blocks it. Whatever lies between has a nonzero class (a starter would be the last
    // one), the highest last after the ordering: it blocks unless its class is lower.
    std::vector<uint32_t> out;
    out.reserve(d.size());
    size_t starter = SIZE_MAX;
    int last_class = 0;  // of the last character kept
    for (uint32_t cp : d) {
        const int cls = combining_class(cp);
        const bool adjacent = starter != SIZE_MAX && out.size() == starter + 1;
        if (starter != SIZE_MAX && (adjacent || (last_class != 0 && last_class < cls))) {
            if (const uint32_t c = compose(out[starter], cp); c != 0) {
                out[starter] = c;
                continue;
            }
        }
        if (cls == 0) starter = out.size();
        last_class = cls;
        out.push_back(cp);
    }
    return out;
}

}  // namespace deltaserve::model::unicode
